package volumemanager_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

// TestPodMarkedForDeletionIsDeletedAfterItsVolumeIsTornDown runs the volume
// manager with RegisterNode (the Node registered by the agent, terminating
// pods torn down and their deletion completed) and the real plugin: a pod
// deleted gracefully stays in the API until its volume is unpublished and
// unstaged, then the agent completes the deletion.
func TestPodMarkedForDeletionIsDeletedAfterItsVolumeIsTornDown(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Nodes().Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
	n := startClusterNode(t, f, func(c *volumemanager.Config) { c.RegisterNode = true })
	vm, handle, pvcName := n.vm, n.handle, "data"

	pods := f.Client.CoreV1().Pods(f.Namespace)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName:   f.NodeName,
			Containers: []corev1.Container{{Name: "app", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvcName},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, "the volume to be published", func(context.Context) (bool, error) {
		for _, v := range vm.Volumes() {
			if v.Handle == handle && len(v.Pods) == 1 && v.Pods[0].State.String() == "Published" {
				return true, nil
			}
		}
		return false, nil
	})

	// A graceful delete of a bound pod only marks it for deletion.
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the agent to complete the pod's deletion", func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	// The pod went only after its volume was unpublished from it (the
	// unstage is the volume's, not the pod's, and may come later, as with
	// the kubelet).
	calls := func() []string { return n.okCalls(t) }
	if got := calls(); len(got) < 3 || !slices.Equal(got[:3], []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume"}) {
		t.Errorf("CSI calls when the pod was gone: %v, want NodeStageVolume, NodePublishVolume, NodeUnpublishVolume first", got)
	}
	poll(t, "the unstage", func(context.Context) (bool, error) {
		return len(vm.Volumes()) == 0 && slices.Contains(calls(), "NodeUnstageVolume"), nil
	})
}

// createBound creates a PV of driver/handle (changed by changePV) and a
// PVC bound to it, as the PV controller (not running here) would leave
// them.
func createBound(t *testing.T, f *k8stest.Fixture, driver, handle, pvcName, pvName string, changePV ...func(*corev1.PersistentVolume)) {
	t.Helper()
	ctx := t.Context()
	size := resource.MustParse("1Gi")
	pvc, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: pvcName, Namespace: f.Namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			VolumeName:  pvName, StorageClassName: ptr.To(""),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: f.Namespace, Name: pvcName, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: handle,
			}},
		},
	}
	for _, change := range changePV {
		change(pv)
	}
	if _, err := f.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Client.CoreV1().PersistentVolumes().Delete(context.WithoutCancel(t.Context()), pvName, metav1.DeleteOptions{})
	})
	pvc.Status.Phase = corev1.ClaimBound
	if _, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func poll(t *testing.T, what string, cond wait.ConditionWithContextFunc) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, standaloneTimeout, true, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// registerNodeFast is RegisterNode with a 4s Lease (renewed every second)
// and the Node's status posted every 200ms.
func registerNodeFast(c *volumemanager.Config) {
	c.RegisterNode = true
	c.Tuning.NodeLeaseDuration, c.Tuning.NodeStatusInterval = 4*time.Second, 200*time.Millisecond
}

// readyHeartbeat returns the Node's Ready heartbeat and its Lease's
// renewTime.
func readyHeartbeat(t *testing.T, f *k8stest.Fixture) (metav1.Time, metav1.MicroTime) {
	t.Helper()
	node, err := f.Client.CoreV1().Nodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var heartbeat metav1.Time
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			heartbeat = c.LastHeartbeatTime
		}
	}
	lease, err := f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return heartbeat, ptr.Deref(lease.Spec.RenewTime, metav1.MicroTime{})
}

// TestRegisterNodeKeepsARemovedOwnerLabelRemoved: with RegisterNode, an
// operator removes the owner label from the Node the agent registered. The
// label stays removed — the node keeper, whose virtual-kubelet node
// controller puts its labels back at each status update, writes nothing
// to a Node without it: no status, no Lease renewal, for 15 status
// intervals and 3 renewals — and the agent stops new work: /readyz fails
// naming the label, csi_volmgr_node_owned is 0, one error line. With the
// label back, the keeper resumes.
func TestRegisterNodeKeepsARemovedOwnerLabelRemoved(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Nodes().Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
	n := startClusterNode(t, f, registerNodeFast)
	poll(t, "/readyz to pass", func(context.Context) (bool, error) { code, _ := n.readyz(); return code == http.StatusOK, nil })

	setOwnerLabel(t, f, false)
	n.untilNotReady(t)
	heartbeat, renewed := readyHeartbeat(t, f)
	quiet(t, 3*time.Second, func() string {
		node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v, ok := node.Labels[volumemanager.OwnerLabel]; ok {
			return "the owner label was put back: " + v
		}
		return ""
	})
	if h, r := readyHeartbeat(t, f); !h.Equal(&heartbeat) || !r.Equal(&renewed) {
		t.Errorf("the keeper wrote to a Node without the label: heartbeat %v -> %v, Lease renewed %v -> %v", heartbeat, h, renewed, r)
	}
	if code, body := n.readyz(); code == http.StatusOK || !strings.Contains(body, volumemanager.OwnerLabel) {
		t.Errorf("/readyz without the label: %d %q", code, body)
	}
	if g := n.ownedGauge(t); g != 0 {
		t.Errorf("csi_volmgr_node_owned %v, want 0", g)
	}
	var errorLines int
	for _, e := range n.logs.Data() {
		if e.Type == ktesting.LogError && strings.Contains(e.Message, "Not acting on the Node") {
			errorLines++
		}
	}
	if errorLines != 1 {
		t.Errorf("%d error lines about the Node not being the agent's, want 1:\n%s", errorLines, n.logs.String())
	}

	setOwnerLabel(t, f, true)
	poll(t, "/readyz to pass with the label back", func(context.Context) (bool, error) { code, _ := n.readyz(); return code == http.StatusOK, nil })
	poll(t, "the keeper's status and Lease again", func(context.Context) (bool, error) {
		h, r := readyHeartbeat(t, f)
		return h.After(heartbeat.Time) && r.After(renewed.Time), nil
	})
}

// TestRegisterNodeDoesNotAdoptAReplacedNode: with RegisterNode, the Node
// the agent registered is deleted and someone else creates one of the same
// name with the owner label (another host with the same name). The agent
// acts on nothing there: /readyz fails saying it was replaced, the gauge is
// 0, an Event on the new Node, and a pod's volume is not published.
func TestRegisterNodeDoesNotAdoptAReplacedNode(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Nodes().Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
	n := startClusterNode(t, f, registerNodeFast)
	poll(t, "/readyz to pass", func(context.Context) (bool, error) { code, _ := n.readyz(); return code == http.StatusOK, nil })

	nodes := f.Client.CoreV1().Nodes()
	var replacement *corev1.Node
	for range 20 {
		if err := nodes.Delete(ctx, f.NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		created, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: f.NodeName, Labels: map[string]string{corev1.LabelHostname: f.NodeName, volumemanager.OwnerLabel: volumemanager.OwnerLabelValue},
		}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue // the keeper created its own first
		}
		if err != nil {
			t.Fatal(err)
		}
		replacement = created
		break
	}
	if replacement == nil {
		t.Fatal("the keeper always created the Node first")
	}
	poll(t, "/readyz to fail: replaced", func(context.Context) (bool, error) {
		code, body := n.readyz()
		return code != http.StatusOK && strings.Contains(body, "was replaced") && strings.Contains(body, string(replacement.UID)), nil
	})
	poll(t, "the Event on the new Node", func(ctx context.Context) (bool, error) {
		events, err := f.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + f.NodeName})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == volumemanager.EventNodeReplaced && e.InvolvedObject.UID == replacement.UID {
				return true, nil
			}
		}
		return false, nil
	})
	pod := createClaimPod(t, f, "app")
	quiet(t, 3*time.Second, func() string {
		if n.published(pod.UID) {
			return "the pod's volume was published on the replaced Node"
		}
		if code, _ := n.readyz(); code == http.StatusOK {
			return "/readyz passes on the replaced Node"
		}
		return ""
	})
	if g := n.ownedGauge(t); g != 0 {
		t.Errorf("csi_volmgr_node_owned %v, want 0", g)
	}
	if calls := n.calls(t); slices.Contains(calls, "NodeStageVolume") || slices.Contains(calls, "NodePublishVolume") {
		t.Errorf("the plugin was called: %v", calls)
	}
	forceDelete(t, f, pod)
}
