package bench_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// attach does for an attach-required volume what the attach/detach
// controller and the external-attacher do once a pod that uses it is
// scheduled to the world's Node: a VolumeAttachment of the volume to the
// Node, named as both name it, marked attached; and the volume in
// node.status.volumesAttached, which the kubelet's reconciler reads before
// it lets WaitForAttach look at the VolumeAttachment. Both agents see the
// same objects: csi-volmgr reads the VolumeAttachment, the kubelet both.
func (w *world) attach(ctx context.Context, tb testing.TB, v benchVolume) {
	tb.Helper()
	storage := w.creator.StorageV1().VolumeAttachments()
	name := attachmentName(v.handle, w.driver, w.fx.NodeName)
	va, err := storage.Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: w.driver, NodeName: w.fx.NodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &v.pv},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("creating VolumeAttachment %s: %v", name, err)
	}
	tb.Cleanup(func() { _ = storage.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) })
	va.Status.Attached = true
	if _, err := storage.UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		tb.Fatalf("marking VolumeAttachment %s attached: %v", name, err)
	}

	nodes := w.creator.CoreV1().Nodes()
	attached := corev1.AttachedVolume{Name: corev1.UniqueVolumeName("kubernetes.io/csi/" + w.driver + "^" + v.handle)}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, w.fx.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if slices.Contains(node.Status.VolumesAttached, attached) {
			return nil
		}
		node.Status.VolumesAttached = append(node.Status.VolumesAttached, attached)
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		tb.Fatalf("adding %s to the Node's volumesAttached: %v", attached.Name, err)
	}
}

// attachmentName is the VolumeAttachment name of a CSI volume on a node,
// as the kubelet's and the attach/detach controller's CSI attacher make it
// (pkg/volume/csi getAttachmentName).
func attachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

// forgetVolumesInUse empties the Node's volumesInUse, which an agent that
// stopped leaves as it last wrote it, so that the next agent starts from
// the same Node as the first one did. Only between scenarios: no volume is
// in use then.
func (w *world) forgetVolumesInUse(ctx context.Context, tb testing.TB) {
	tb.Helper()
	nodes := w.creator.CoreV1().Nodes()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, w.fx.NodeName, metav1.GetOptions{})
		if err != nil || len(node.Status.VolumesInUse) == 0 {
			return err
		}
		node.Status.VolumesInUse = nil
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		tb.Fatalf("emptying the Node's volumesInUse: %v", err)
	}
}

const (
	// EnvAttachPods names an environment variable with how many pods
	// BenchmarkAttachToStage runs one after another per attach lag
	// (default 5).
	EnvAttachPods = "KUBELET_BENCH_ATTACH_PODS"
	// EnvAttachLags names an environment variable with the attach lags of
	// BenchmarkAttachToStage, comma-separated Go durations (default
	// 500ms,2s,10s): how long after its pod was created each volume is
	// attached, the attach/detach controller's and the external-attacher's
	// time, during which the agent waits. The kubelet's wait depends on
	// where the lag falls in its 10 s node status period.
	EnvAttachLags = "KUBELET_BENCH_ATTACH_LAGS"
)

// attachLags parses EnvAttachLags.
func attachLags(b testing.TB) []time.Duration {
	b.Helper()
	s := os.Getenv(EnvAttachLags)
	if s == "" {
		return []time.Duration{500 * time.Millisecond, 2 * time.Second, 10 * time.Second}
	}
	var out []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d < 0 {
			b.Fatalf("%s=%q: want comma-separated durations", EnvAttachLags, s)
		}
		out = append(out, d)
	}
	return out
}

// BenchmarkAttachToStage measures, for both agents, the wait between a
// volume becoming attached and NodeStageVolume, for each attach lag of
// EnvAttachLags (a row each): EnvAttachPods pods one after another, each
// with an attach-required volume whose VolumeAttachment exists (not
// attached) when the pod is created; the lag later the world
// marks it attached as the attach/detach controller and external-attacher
// would (node.status.volumesAttached first, then the VolumeAttachment's
// status.attached). The clock starts when the VolumeAttachment's status
// update is sent and stops when NodeStageVolume begins in the plugin. The
// kubelet verifies an attached volume only once a node status update
// reported it in use and retries a failed verification with exponential
// backoff (from 500 ms); csi-volmgr watches the VolumeAttachment.
//
//	make bench-kubelet   (or: go test -run='^$' -bench=AttachToStage -benchtime=1x ./bench/)
func BenchmarkAttachToStage(b *testing.B) {
	attachPods := intList(b, EnvAttachPods, []int{5})[0]
	book.setting("attach lags", attachLags(b))
	book.setting("attach pods per lag", attachPods)
	w := newWorld(b.Context(), b, worldOptions{driver: "attachstage.kubelet-bench.csi-volmgr.io", volumes: attachPods, attachRequired: true})
	for _, attachLag := range attachLags(b) {
		b.Run(fmt.Sprintf("lag=%v", attachLag), func(b *testing.B) {
			for range b.N {
				attachScenario(b, w, attachLag, attachPods)
			}
		})
	}
}

func attachScenario(b *testing.B, w *world, attachLag time.Duration, attachPods int) {
	sideBySide(b.Context(), b, w, scenario{
		name: fmt.Sprintf("attach-required volume attached %v after its pod was created, %d pods one after another", attachLag, attachPods),
		run: func(ctx context.Context, b *testing.B, w *world, a *agent) []figure {
			defer w.detachAll(ctx, b)
			var toStage, toPublished []time.Duration
			for i, v := range w.volumes {
				va := w.createAttachment(ctx, b, v)
				created := time.Now()
				if _, err := w.creator.CoreV1().Pods(w.fx.Namespace).Create(ctx,
					newPod(fmt.Sprintf("%s-a%d-%02d", a.tag, attachLag.Milliseconds(), i), w.fx.NodeName, v.claim), metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
				time.Sleep(time.Until(created.Add(attachLag)))
				attached := w.markAttached(ctx, b, v, va)
				var stageBegin time.Time
				waitFor(ctx, b, time.Millisecond, runTimeout, a.kind.name+" staged "+v.handle, func() (bool, error) {
					if _, err := w.journal.poll(); err != nil {
						return false, err
					}
					if cs := w.journal.calls(v.handle, created, "NodeStageVolume"); len(cs) > 0 {
						stageBegin = cs[0].begin
					}
					return w.journal.lastOK(v.handle, "NodePublishVolume", created), nil
				})
				toStage = append(toStage, stageBegin.Sub(attached))
				pubs := w.journal.calls(v.handle, created, "NodePublishVolume")
				toPublished = append(toPublished, pubs[len(pubs)-1].end.Sub(attached))
			}
			w.deletePods(ctx, b, a, attachPods)
			st, pub := newDist(toStage), newDist(toPublished)
			return []figure{
				{name: "attached → NodeStageVolume begins, p50 (ms)", key: "attach_to_stage_p50_ms", value: ms(st.q(.5))},
				{name: "attached → NodeStageVolume begins, max (ms)", key: "attach_to_stage_max_ms", value: ms(st.q(1))},
				{name: "attached → published, p50 (ms)", key: "attach_to_published_p50_ms", value: ms(pub.q(.5))},
			}
		},
	})
}

// createAttachment creates the VolumeAttachment of v to the world's Node,
// not yet attached, as the attach/detach controller does once the pod is
// scheduled.
func (w *world) createAttachment(ctx context.Context, tb testing.TB, v benchVolume) *storagev1.VolumeAttachment {
	tb.Helper()
	name := attachmentName(v.handle, w.driver, w.fx.NodeName)
	va, err := w.creator.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: w.driver, NodeName: w.fx.NodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &v.pv},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("creating VolumeAttachment %s: %v", name, err)
	}
	return va
}

// markAttached does what the attach/detach controller and the
// external-attacher do once the volume is attached: the volume into
// node.status.volumesAttached, then status.attached on the
// VolumeAttachment. It returns when the latter was sent.
func (w *world) markAttached(ctx context.Context, tb testing.TB, v benchVolume, va *storagev1.VolumeAttachment) time.Time {
	tb.Helper()
	nodes := w.creator.CoreV1().Nodes()
	attached := corev1.AttachedVolume{Name: corev1.UniqueVolumeName("kubernetes.io/csi/" + w.driver + "^" + v.handle)}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, w.fx.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.VolumesAttached = append(node.Status.VolumesAttached, attached)
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		tb.Fatalf("adding %s to the Node's volumesAttached: %v", attached.Name, err)
	}
	va.Status.Attached = true
	sent := time.Now()
	if _, err := w.creator.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		tb.Fatalf("marking VolumeAttachment %s attached: %v", va.Name, err)
	}
	return sent
}

// detachAll deletes the world's VolumeAttachments and empties the Node's
// volumesAttached, as after the detach of every volume.
func (w *world) detachAll(ctx context.Context, tb testing.TB) {
	tb.Helper()
	for _, v := range w.volumes {
		_ = w.creator.StorageV1().VolumeAttachments().Delete(ctx, attachmentName(v.handle, w.driver, w.fx.NodeName), metav1.DeleteOptions{})
	}
	nodes := w.creator.CoreV1().Nodes()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, w.fx.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.VolumesAttached = nil
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		tb.Fatalf("emptying the Node's volumesAttached: %v", err)
	}
}
