package volumemanager_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// ownerQuiet is how long a test watches the agent do nothing on a Node it
// does not own.
const ownerQuiet = 25 * time.Second

// nodeIDAnnotation is where the kubelet (and the agent) publish the
// drivers' node IDs.
const nodeIDAnnotation = "csi.volume.kubernetes.io/nodeid"

// createKubeletNode creates f's Node as a kubelet leaves it: node info with
// a kubelet version, a Ready condition, a Lease in kube-node-lease; with the
// owner label only when labelled.
func createKubeletNode(t *testing.T, f *k8stest.Fixture, labelled bool) {
	t.Helper()
	ctx := t.Context()
	node := f.CreateNode(t, func(n *corev1.Node) {
		if !labelled {
			delete(n.Labels, volumemanager.OwnerLabel)
		}
	})
	now := metav1.Now()
	node.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.34.0", OperatingSystem: "linux", Architecture: "amd64"}
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := f.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	leases := f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	if _, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: f.NodeName},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(f.NodeName), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: now.Time},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = leases.Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
}

// setOwnerLabel adds or removes the owner label of f's Node.
func setOwnerLabel(t *testing.T, f *k8stest.Fixture, on bool) {
	t.Helper()
	var value any // null removes the label
	if on {
		value = volumemanager.OwnerLabelValue
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{volumemanager.OwnerLabel: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.CoreV1().Nodes().Patch(t.Context(), f.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createClaimPod creates a pod on f's node that mounts the claim "data".
func createClaimPod(t *testing.T, f *k8stest.Fixture, name string) *corev1.Pod {
	t.Helper()
	pod, err := f.Client.CoreV1().Pods(f.Namespace).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName:   f.NodeName,
			Containers: []corev1.Container{{Name: "app", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// forceDelete deletes the pod at once, as pod GC or kubectl --force does.
func forceDelete(t *testing.T, f *k8stest.Fixture, pod *corev1.Pod) {
	t.Helper()
	if err := f.Client.CoreV1().Pods(f.Namespace).Delete(t.Context(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
}

// readyz returns /readyz's status code and body.
func (n *clusterNode) readyz() (int, string) {
	rec := httptest.NewRecorder()
	n.vm.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code, rec.Body.String()
}

// published says whether the pod's use of the node's volume is Published.
func (n *clusterNode) published(uid types.UID) bool {
	for _, v := range n.vm.Volumes() {
		if v.Handle != n.handle {
			continue
		}
		for _, p := range v.Pods {
			if p.Key.Pod == uid && p.State.String() == "Published" {
				return true
			}
		}
	}
	return false
}

// calls returns the CSI methods the plugin was asked for on the node's
// volume, whatever their outcome.
func (n *clusterNode) calls(t *testing.T) []string {
	t.Helper()
	entries, err := n.plugin.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Event == plugin.EventStart && e.VolumeID == n.handle {
			out = append(out, e.Method)
		}
	}
	return out
}

// ownedGauge returns csi_volmgr_node_owned.
func (n *clusterNode) ownedGauge(t *testing.T) float64 {
	t.Helper()
	families, err := n.vm.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == "csi_volmgr_node_owned" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no csi_volmgr_node_owned")
	return 0
}

// quiet watches for d that bad never reports anything; it fails t with
// what bad reported.
func quiet(t *testing.T, d time.Duration, bad func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if what := bad(); what != "" {
			t.Fatalf("after %v: %s", d-time.Until(deadline), what)
		}
		select {
		case <-t.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// untilNotReady waits until /readyz fails naming the owner label.
func (n *clusterNode) untilNotReady(t *testing.T) {
	t.Helper()
	poll(t, "/readyz to fail naming the owner label", func(context.Context) (bool, error) {
		code, body := n.readyz()
		return code != http.StatusOK && strings.Contains(body, volumemanager.OwnerLabel+"="+volumemanager.OwnerLabelValue), nil
	})
}

// TestAgentLeavesAKubeletsNodeAlone starts the agent, without
// RegisterNode, for a Node as a kubelet leaves it and without the owner
// label: a pod with a claim on it gets nothing from the agent — no stage,
// no publish, no mount, no volumesInUse, no node ID annotation, no CSINode
// — /readyz fails and says why, and the log has one error line naming the
// Node and the label.
func TestAgentLeavesAKubeletsNodeAlone(t *testing.T) {
	f := k8stest.New(t)
	createKubeletNode(t, f, false)
	n := startClusterNodeWith(t, f, clusterNodeOptions{NoNode: true})
	pod := createClaimPod(t, f, "app")
	ctx := t.Context()

	quiet(t, ownerQuiet, func() string {
		if calls := n.calls(t); slices.Contains(calls, "NodeStageVolume") || slices.Contains(calls, "NodePublishVolume") {
			return "the plugin was called: " + strings.Join(calls, ", ")
		}
		if mps := mountsUnder(t, n.root); len(mps) > 0 {
			return "mounts under the root: " + strings.Join(mps, ", ")
		}
		if n.published(pod.UID) {
			return "the pod's volume was published"
		}
		return ""
	})
	node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(node.Status.VolumesInUse) > 0 {
		t.Errorf("status.volumesInUse written: %v", node.Status.VolumesInUse)
	}
	if v, ok := node.Annotations[nodeIDAnnotation]; ok {
		t.Errorf("annotation %s written: %q", nodeIDAnnotation, v)
	}
	if _, ok := node.Annotations[volumemanager.ControllerManagedAttachAnnotation]; ok {
		t.Errorf("annotation %s written", volumemanager.ControllerManagedAttachAnnotation)
	}
	if _, err := f.Client.StorageV1().CSINodes().Get(ctx, f.NodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("CSINode %s: %v, want NotFound", f.NodeName, err)
	}
	got, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) > 0 {
		t.Errorf("pod conditions written: %v", got.Status.Conditions)
	}
	code, body := n.readyz()
	if code == http.StatusOK || !strings.Contains(body, volumemanager.OwnerLabel+"="+volumemanager.OwnerLabelValue) ||
		!strings.Contains(body, f.NodeName) {
		t.Errorf("/readyz: %d %q, want a failure naming the Node and the label", code, body)
	}
	if g := n.ownedGauge(t); g != 0 {
		t.Errorf("csi_volmgr_node_owned %v, want 0", g)
	}
	var errorLines int
	for _, e := range n.logs.Data() {
		if e.Type == ktesting.LogError && strings.Contains(e.Message, "Not acting on the Node") {
			errorLines++
			if !strings.Contains(strings.Join(kvStrings(e.WithKVList, e.ParameterKVList), " "), f.NodeName) {
				t.Errorf("the error line does not name the Node: %+v", e)
			}
		}
	}
	if errorLines != 1 {
		t.Errorf("%d error lines about the Node not being the agent's, want 1:\n%s", errorLines, n.logs.String())
	}
}

func kvStrings(lists ...[]any) []string {
	var out []string
	for _, l := range lists {
		for _, v := range l {
			b, _ := json.Marshal(v)
			out = append(out, string(b))
		}
	}
	return out
}

// TestAgentServesALabelledKubeletNode: the same Node as
// TestAgentLeavesAKubeletsNodeAlone, with the owner label: the pod's volume
// is published, /readyz passes, and the volume is torn down once the pod
// is gone.
func TestAgentServesALabelledKubeletNode(t *testing.T) {
	f := k8stest.New(t)
	createKubeletNode(t, f, true)
	n := startClusterNodeWith(t, f, clusterNodeOptions{NoNode: true})
	pod := createClaimPod(t, f, "app")
	poll(t, "the pod's volume to be published", func(context.Context) (bool, error) { return n.published(pod.UID), nil })
	poll(t, "/readyz to pass", func(context.Context) (bool, error) { code, _ := n.readyz(); return code == http.StatusOK, nil })
	if g := n.ownedGauge(t); g != 1 {
		t.Errorf("csi_volmgr_node_owned %v, want 1", g)
	}
	forceDelete(t, f, pod)
	poll(t, "the teardown", func(context.Context) (bool, error) {
		return len(n.vm.Volumes()) == 0 && len(mountsUnder(t, n.root)) == 0, nil
	})
	if got := n.okCalls(t); !slices.Equal(got, []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"}) {
		t.Errorf("CSI calls %v, want stage, publish, unpublish, unstage", got)
	}
}

// TestOwnerLabelRemovedWhilePublished takes the owner label away while a
// pod's volume is published: the volume stays mounted (even when its pod
// goes), a new pod's volume is not published and /readyz fails; with the
// label back the new pod's volume is published and the gone pod's torn
// down.
func TestOwnerLabelRemovedWhilePublished(t *testing.T) {
	f := k8stest.New(t)
	createKubeletNode(t, f, true)
	n := startClusterNodeWith(t, f, clusterNodeOptions{NoNode: true})
	first := createClaimPod(t, f, "first")
	poll(t, "the first pod's volume to be published", func(context.Context) (bool, error) { return n.published(first.UID), nil })
	mounted := mountsUnder(t, n.root)

	setOwnerLabel(t, f, false)
	n.untilNotReady(t)
	second := createClaimPod(t, f, "second")
	forceDelete(t, f, first)
	quiet(t, 10*time.Second, func() string {
		if n.published(second.UID) {
			return "the second pod's volume was published without the label"
		}
		if calls := n.calls(t); slices.Contains(calls, "NodeUnpublishVolume") || slices.Contains(calls, "NodeUnstageVolume") {
			return "a volume was torn down without the label: " + strings.Join(calls, ", ")
		}
		if now := mountsUnder(t, n.root); !slices.Equal(now, mounted) {
			return "the mounts changed without the label: " + strings.Join(now, ", ")
		}
		return ""
	})
	if code, body := n.readyz(); code == http.StatusOK {
		t.Errorf("/readyz passes without the label: %q", body)
	}

	setOwnerLabel(t, f, true)
	poll(t, "the second pod's volume to be published", func(context.Context) (bool, error) { return n.published(second.UID), nil })
	poll(t, "the first pod's volume to be torn down", func(context.Context) (bool, error) {
		for _, v := range n.vm.Volumes() {
			for _, p := range v.Pods {
				if p.Key.Pod == first.UID {
					return false, nil
				}
			}
		}
		return true, nil
	})
	poll(t, "/readyz to pass", func(context.Context) (bool, error) { code, _ := n.readyz(); return code == http.StatusOK, nil })
	forceDelete(t, f, second)
	poll(t, "the teardown", func(context.Context) (bool, error) {
		return len(n.vm.Volumes()) == 0 && len(mountsUnder(t, n.root)) == 0, nil
	})
}

// TestRegisterNodeLeavesAKubeletsNodeAlone starts the agent with
// RegisterNode for an existing Node as a kubelet leaves it, without the
// owner label: the node keeper does not take it over — nothing of it is
// written — and the agent is not ready. Once an operator labels the Node,
// the keeper keeps it.
func TestRegisterNodeLeavesAKubeletsNodeAlone(t *testing.T) {
	f := k8stest.New(t)
	createKubeletNode(t, f, false)
	ctx := t.Context()
	before, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := startClusterNodeWith(t, f, clusterNodeOptions{Configure: func(c *volumemanager.Config) { c.RegisterNode = true }})
	pod := createClaimPod(t, f, "app")
	n.untilNotReady(t)
	quiet(t, 10*time.Second, func() string {
		node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if node.ResourceVersion != before.ResourceVersion {
			return "the Node was written: labels " + strings.Join(mapKeys(node.Labels), ",") + ", annotations " + strings.Join(mapKeys(node.Annotations), ",")
		}
		if calls := n.calls(t); len(calls) > 0 {
			return "the plugin was called: " + strings.Join(calls, ", ")
		}
		return ""
	})
	if !strings.Contains(n.logs.String(), "Not registering the Node") {
		t.Errorf("no log line about the Node not being registered:\n%s", n.logs.String())
	}

	// The kubelet is gone for long: its Lease expired (the keeper waits
	// for a Lease another holder renewed within its duration).
	leases := f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	lease, err := leases.Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-2 * time.Minute)}
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	setOwnerLabel(t, f, true)
	poll(t, "the keeper to keep the labelled Node", func(ctx context.Context) (bool, error) {
		node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
		return err == nil && node.Annotations[volumemanager.ControllerManagedAttachAnnotation] == "true", nil
	})
	poll(t, "/readyz to pass", func(context.Context) (bool, error) { code, _ := n.readyz(); return code == http.StatusOK, nil })
	poll(t, "the pod's volume to be published", func(context.Context) (bool, error) { return n.published(pod.UID), nil })
	forceDelete(t, f, pod)
	poll(t, "the teardown", func(context.Context) (bool, error) {
		return len(n.vm.Volumes()) == 0 && len(mountsUnder(t, n.root)) == 0, nil
	})
}

func mapKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestRecreatedNodeIsAnotherNode deletes the Node a runtime-mode agent
// serves and creates another of the same name, owner label included (a
// cloned host registering under the same name): the agent pinned the
// first Node's UID, so it does not serve the second — /readyz fails, a new
// pod's volume is not published — and it unmounts nothing it published
// for the first. Restarted, it serves the Node it finds.
func TestRecreatedNodeIsAnotherNode(t *testing.T) {
	f := k8stest.New(t)
	createKubeletNode(t, f, true)
	n := startClusterNodeWith(t, f, clusterNodeOptions{NoNode: true})
	first := createClaimPod(t, f, "first")
	poll(t, "the first pod's volume to be published", func(context.Context) (bool, error) { return n.published(first.UID), nil })
	mounted := mountsUnder(t, n.root)

	nodes := f.Client.CoreV1().Nodes()
	old, err := nodes.Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := nodes.Delete(t.Context(), f.NodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	recreated, err := nodes.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.NodeName, Labels: old.Labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if recreated.UID == old.UID {
		t.Fatalf("the recreated Node has the first one's UID %s", old.UID)
	}
	poll(t, "/readyz to fail saying the Node was replaced", func(context.Context) (bool, error) {
		code, body := n.readyz()
		return code != http.StatusOK && strings.Contains(body, "was replaced"), nil
	})
	second := createClaimPod(t, f, "second")
	quiet(t, 10*time.Second, func() string {
		if n.published(second.UID) {
			return "a pod of the recreated Node had its volume published"
		}
		if calls := n.calls(t); slices.Contains(calls, "NodeUnpublishVolume") || slices.Contains(calls, "NodeUnstageVolume") {
			return "a volume was torn down after the Node was recreated: " + strings.Join(calls, ", ")
		}
		if now := mountsUnder(t, n.root); !slices.Equal(now, mounted) {
			return "the mounts changed after the Node was recreated: " + strings.Join(now, ", ")
		}
		return ""
	})
	if code, body := n.readyz(); code == http.StatusOK || !strings.Contains(body, "was replaced") {
		t.Errorf("/readyz after the quiet period: %d %q, want a failure saying the Node was replaced", code, body)
	}

	// Restarted, the agent serves the Node it finds.
	n.restart(t)
	poll(t, "the second pod's volume to be published after a restart", func(context.Context) (bool, error) { return n.published(second.UID), nil })
	forceDelete(t, f, first)
	forceDelete(t, f, second)
	poll(t, "the teardown", func(context.Context) (bool, error) {
		return len(n.vm.Volumes()) == 0 && len(mountsUnder(t, n.root)) == 0, nil
	})
}
