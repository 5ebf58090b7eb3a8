//go:build e2e

package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// benchPods is how many pods BenchmarkVirtualNodePods starts together.
const benchPods = 50

// BenchmarkVirtualNodePods creates benchPods pods at once on the virtual
// node, each with one claim bound to its own pre-created PV of the driver
// that needs attach, with the real scheduler, controllers and attacher
// (startCluster), and deletes them again. It reports, from watch events
// seen by the test (one clock):
//
//   - created→Running p50 and p99: the whole path;
//   - its parts: created→scheduled (scheduler, PV binding), scheduled→
//     attached (attach/detach controller, external-attacher),
//     attached→published (csi-volmgr's share: it sees the attachment,
//     stages and publishes; the end of NodePublishVolume is read from the
//     plugin's journal, on the same clock), published→Running (the example
//     runtime starting the process, virtual-kubelet writing the status);
//   - delete→VolumeAttachment gone, p50.
func BenchmarkVirtualNodePods(b *testing.B) {
	c := startCluster(b)
	tl := watchTimeline(b, c.client, c.namespace, c.node)
	ctx := b.Context()
	for round := range b.N {
		names := make([]string, benchPods)
		handles := map[string]string{}
		for i := range names {
			names[i] = fmt.Sprintf("r%d-p%02d", round, i)
			handle := c.staticVolume(c.attach, "pv-"+names[i], "")
			handles[names[i]] = handle
			tl.track("pv-"+names[i], corev1.UniqueVolumeName(volume.PersistentName(attachDriver, handle)))
		}
		b.ResetTimer()
		for _, n := range names {
			pvc := claimSpec("")
			pvc.VolumeName = "pv-" + n
			if _, err := c.client.CoreV1().PersistentVolumeClaims(c.namespace).Create(ctx, &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: c.namespace}, Spec: pvc,
			}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		for _, n := range names {
			if _, err := c.client.CoreV1().Pods(c.namespace).Create(ctx,
				c.pod(n, "echo hello > /data/hello && exec sleep 3600", claimVolume("data", n)), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		c.waitFor("every pod running", func(context.Context) (bool, error) {
			pods, _ := tl.snapshot()
			for _, n := range names {
				if pods[n].running.IsZero() {
					return false, nil
				}
			}
			return true, nil
		})
		deleted := map[string]time.Time{}
		for _, n := range names {
			deleted[n] = time.Now()
			if err := c.client.CoreV1().Pods(c.namespace).Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		c.waitFor("every VolumeAttachment gone", func(ctx context.Context) (bool, error) {
			_, vols := tl.snapshot()
			for _, n := range names {
				if vols["pv-"+n].detached.IsZero() {
					return false, nil
				}
			}
			return true, nil
		})
		b.StopTimer()
		pods, vols := tl.snapshot()
		published := publishTimes(b, c)
		var total, sched, attach, agent, runtime, detach []time.Duration
		for _, n := range names {
			p, v := pods[n], vols["pv-"+n]
			pub, ok := published[handles[n]]
			if !ok {
				b.Fatalf("no NodePublishVolume of %s's volume in the plugin's journal", n)
			}
			total = append(total, p.running.Sub(p.created))
			sched = append(sched, p.scheduled.Sub(p.created))
			attach = append(attach, v.attached.Sub(p.scheduled))
			agent = append(agent, pub.Sub(latest(v.attached, p.scheduled)))
			runtime = append(runtime, p.running.Sub(pub))
			detach = append(detach, v.detached.Sub(deleted[n]))
			if v.detached.Before(v.notInUse) {
				b.Errorf("%s: VolumeAttachment deleted before the Node stopped listing the volume", n)
			}
		}
		report := func(name string, d []time.Duration, q float64) time.Duration {
			v := percentile(d, q)
			b.ReportMetric(v.Seconds(), name)
			return v
		}
		b.Logf("%d pods, one attach-required PVC each: created→Running p50 %v p99 %v; parts p50: created→scheduled %v, scheduled→attached %v, attached→published (csi-volmgr) %v (p99 %v), published→Running (runtime and virtual-kubelet) %v; delete→VolumeAttachment gone p50 %v",
			benchPods,
			report("running_p50_s", total, 0.5), report("running_p99_s", total, 0.99),
			report("scheduled_p50_s", sched, 0.5), report("attached_p50_s", attach, 0.5),
			report("csivolmgr_p50_s", agent, 0.5), report("csivolmgr_p99_s", agent, 0.99),
			report("runtime_p50_s", runtime, 0.5), report("detached_p50_s", detach, 0.5))
		// Wait for the pods to be gone before the next round.
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			for _, n := range names {
				if _, err := c.client.CoreV1().Pods(c.namespace).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return false, nil
				}
			}
			return true, nil
		}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// publishTimes returns when each volume's first NodePublishVolume ended
// successfully, by handle.
func publishTimes(b *testing.B, c *cluster) map[string]time.Time {
	entries, err := c.attach.ReadJournal()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]time.Time{}
	for _, e := range entries {
		if _, seen := out[e.VolumeID]; !seen && e.Method == "NodePublishVolume" && e.Event == plugin.EventEnd && e.Code == "OK" {
			out[e.VolumeID] = e.Time
		}
	}
	return out
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// percentile returns the q-quantile of d (nearest rank).
func percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
