package vkubelet_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/vkubelet"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

// TestVolumesInUseSurvivesTheNodeControllersPatches runs virtual-kubelet's
// real NodeController on a real API server with a provider that reports a
// Node copied from the API server — volumesInUse included, stale — and the
// agent's volumesInUse writer beside it. Wrapped (NewNodeProvider), the
// node controller's three-way status patches never touch the list. Bare,
// they revert it to the stale copy, and the writer's Node watch puts it
// back.
func TestVolumesInUseSurvivesTheNodeControllersPatches(t *testing.T) {
	for _, wrapped := range []bool{true, false} {
		name := map[bool]string{true: "wrapped", false: "bare"}[wrapped]
		t.Run(name, func(t *testing.T) {
			f := k8stest.New(t)
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			nodes := f.Client.CoreV1().Nodes()
			t.Cleanup(func() { _ = nodes.Delete(context.WithoutCancel(ctx), f.NodeName, metav1.DeleteOptions{}) })

			naive := node.NewNaiveNodeProvider()
			var provider node.NodeProvider = naive
			start := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.NodeName}, Status: corev1.NodeStatus{
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Start"}},
			}}
			if wrapped {
				provider = vkubelet.NewNodeProvider(naive)
				vkubelet.PrepareNode(start)
			}
			nc, err := node.NewNodeController(provider, start, nodes)
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = nc.Run(ctx) }()
			select {
			case <-nc.Ready():
			case <-nc.Done():
				t.Fatalf("node controller stopped: %v", nc.Err())
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}

			inUse, err := status.NewVolumesInUse(status.VolumesInUseConfig{Client: f.Client, NodeName: f.NodeName})
			if err != nil {
				t.Fatal(err)
			}
			go inUse.Run(ctx, nil)
			go source.WatchNode(ctx, f.Client, f.NodeName, inUse.NodeChanged)
			a, b := volume.Name("kubernetes.io/csi/d^a"), volume.Name("kubernetes.io/csi/d^b")
			inUse.Set([]volume.Name{a})
			stale := waitForNode(t, f, "volume a in use", func(n *corev1.Node) bool {
				return slices.Equal(n.Status.VolumesInUse, []corev1.UniqueVolumeName{corev1.UniqueVolumeName(a)})
			})
			if wrapped && stale.Annotations[vkubelet.ControllerManagedAttachAnnotation] != "true" {
				t.Errorf("Node annotations %v: no %s", stale.Annotations, vkubelet.ControllerManagedAttachAnnotation)
			}

			// The provider reports its Node, a copy read from the API
			// server: volumesInUse [a]. The node controller applies it.
			report := func(reason string) {
				n := stale.DeepCopy()
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: reason}}
				if err := naive.UpdateStatus(ctx, n); err != nil {
					t.Fatal(err)
				}
				waitForNode(t, f, "condition reason "+reason, func(n *corev1.Node) bool { return readyReason(n) == reason })
			}
			report("First")
			inUse.Set([]volume.Name{a, b})
			waitForNode(t, f, "volumes a and b in use", func(n *corev1.Node) bool { return len(n.Status.VolumesInUse) == 2 })

			// Watch every version of the Node from here: was b ever dropped?
			w, err := nodes.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + f.NodeName, ResourceVersion: mustGet(t, f).ResourceVersion})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			report("Second")
			report("Third")
			dropped := false
			for {
				ev := <-w.ResultChan()
				n, ok := ev.Object.(*corev1.Node)
				if !ok {
					t.Fatalf("watch event %v", ev.Type)
				}
				if !slices.Contains(n.Status.VolumesInUse, corev1.UniqueVolumeName(b)) {
					dropped = true
				}
				if readyReason(n) == "Third" && slices.Contains(n.Status.VolumesInUse, corev1.UniqueVolumeName(b)) {
					break
				}
			}
			if wrapped && dropped {
				t.Error("the node controller's status patch dropped a volume in use")
			}
			if !wrapped && !dropped {
				t.Error("a bare provider's stale Node did not drop the volume: this test shows nothing")
			}
		})
	}
}

func readyReason(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Reason
		}
	}
	return ""
}

func mustGet(t *testing.T, f *k8stest.Fixture) *corev1.Node {
	t.Helper()
	n, err := f.Client.CoreV1().Nodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func waitForNode(t *testing.T, f *k8stest.Fixture, what string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	}); err != nil {
		t.Fatalf("waiting for %s: %v; node status %+v", what, err, last)
	}
	return last
}
