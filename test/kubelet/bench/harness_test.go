package bench_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// harnessPods is how many pods TestAgentsRestart publishes.
const harnessPods = 3

// TestAgentsRestart checks the harness the benchmarks stand on, for each
// agent: started on the world, it publishes harnessPods pods' volumes
// (seen in the plugin's journal and the mount table); stopped with
// SIGTERM and started again, and then killed and started again, on the
// same root directory, it keeps every volume mounted and unstages and
// unpublishes nothing; after the pods are deleted it tears everything
// down. It prints how many stage and publish calls each restart made (the
// kubelet re-sends them).
//
//	cd test/kubelet && go test -run=AgentsRestart ./bench/   (make bench-kubelet builds the binaries)
func TestAgentsRestart(t *testing.T) {
	ctx := t.Context()
	w := newWorld(ctx, t, worldOptions{driver: "harness.kubelet-bench.csi-volmgr.io", volumes: harnessPods})
	for _, col := range []*column{colKubelet, colVolmgrDefaults} {
		kind := col.kind
		t.Run(kind.name, func(t *testing.T) {
			a := startAgent(ctx, t, w, col, 0)
			began := time.Now()
			for i, v := range w.volumes {
				if _, err := w.creator.CoreV1().Pods(w.fx.Namespace).Create(ctx,
					newPod(fmt.Sprintf("%s-h-%d", kind.short, i), w.fx.NodeName, v.claim), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			w.waitPublished(ctx, t, a, began)
			published := len(mountsBelow(t, a.root))
			// A stage and a publish mount per pod (the test plugin bind-mounts both).
			if published != 2*harnessPods {
				t.Fatalf("%d mounts below %s, want %d", published, a.root, 2*harnessPods)
			}

			for _, crash := range []bool{false, true} {
				since := time.Now()
				a.restart(ctx, t, w, crash)
				ready := time.Since(since)
				// The kubelet reconstructs and then mounts again (SetUp of
				// every volume); wait until it did, or two seconds.
				time.Sleep(2 * time.Second)
				if _, err := w.journal.poll(); err != nil {
					t.Fatal(err)
				}
				var stage, publish, teardown int
				for _, v := range w.volumes {
					for _, c := range w.journal.calls(v.handle, since, "NodeStageVolume", "NodePublishVolume",
						"NodeUnpublishVolume", "NodeUnstageVolume") {
						switch c.method {
						case "NodeStageVolume":
							stage++
						case "NodePublishVolume":
							publish++
						default:
							teardown++
						}
					}
				}
				if teardown != 0 {
					t.Errorf("restart (crash %v): %d unpublish/unstage calls for pods that still run", crash, teardown)
				}
				if n := len(mountsBelow(t, a.root)); n != published {
					t.Errorf("restart (crash %v): %d mounts below the root, want %d", crash, n, published)
				}
				t.Logf("%s restart (crash %v): ready and registered after %v; %d NodeStageVolume and %d NodePublishVolume calls within 2 s",
					kind.name, crash, ready.Round(time.Millisecond), stage, publish)
			}
			teardown := w.deletePods(ctx, t, a, harnessPods)
			t.Logf("%s: teardown %v", kind.name, teardown.Round(time.Millisecond))
			if err := a.stop(t, w); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAttachRequired checks the harness with an attach-required driver,
// for each agent: the world attaches the volume as the attach/detach
// controller and external-attacher would (attach) before the pod exists;
// the agent publishes the pod's volume and reports it in the Node's
// volumesInUse. For the kubelet that goes through the node status
// stand-in: the reconciler verifies an attachable volume only once a node
// status update reported it in use, so it waits for the next status loop
// (NodeStatusUpdateFrequency, 10 s); the time is printed.
func TestAttachRequired(t *testing.T) {
	ctx := t.Context()
	w := newWorld(ctx, t, worldOptions{driver: "attach.kubelet-bench.csi-volmgr.io", volumes: 1, attachRequired: true})
	v := w.volumes[0]
	w.attach(ctx, t, v)
	unique := corev1.UniqueVolumeName("kubernetes.io/csi/" + w.driver + "^" + v.handle)
	for _, col := range []*column{colKubelet, colVolmgrDefaults} {
		kind := col.kind
		t.Run(kind.name, func(t *testing.T) {
			a := startAgent(ctx, t, w, col, 0)
			began := time.Now()
			if _, err := w.creator.CoreV1().Pods(w.fx.Namespace).Create(ctx,
				newPod(kind.short+"-attach", w.fx.NodeName, v.claim), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			w.waitPublished(ctx, t, a, began)
			t.Logf("%s: attach-required volume published %v after the pod was created",
				kind.name, time.Since(began).Round(time.Millisecond))
			waitFor(ctx, t, 100*time.Millisecond, time.Minute, kind.name+" reported the volume in use", func() (bool, error) {
				node, err := w.creator.CoreV1().Nodes().Get(ctx, w.fx.NodeName, metav1.GetOptions{})
				return err == nil && slices.Contains(node.Status.VolumesInUse, unique), err
			})
			w.deletePods(ctx, t, a, 1)
			if err := a.stop(t, w); err != nil {
				t.Fatal(err)
			}
		})
	}
}
