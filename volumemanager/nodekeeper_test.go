package volumemanager

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// The node keeper's tests run in the external test package's binary, whose
// TestMain (k8stest.Main) starts the API server.

const nodeWaitTimeout = 30 * time.Second

func untilNode(t *testing.T, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, nodeWaitTimeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

func readyCondition(node *corev1.Node) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// cleanupNode deletes the Node and its Lease when the test ends.
func cleanupNode(t *testing.T, client kubernetes.Interface, name string) {
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		if err := client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting Node: %v", err)
		}
		if err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting Lease: %v", err)
		}
	})
}

func TestRegisterAndKeepTheNode(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	cleanupNode(t, f.Client, f.NodeName)
	// A 4s Lease renewed every second, the status posted every 200ms.
	n := newNodeKeeper(f.Client, f.NodeName, 4*time.Second, 200*time.Millisecond)
	if err := n.Register(ctx); err != nil {
		t.Fatal(err)
	}
	nodes := f.Client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{corev1.LabelHostname: f.NodeName, corev1.LabelOSStable: runtime.GOOS, corev1.LabelArchStable: runtime.GOARCH, OwnerLabel: OwnerLabelValue} {
		if node.Labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, node.Labels[k], v)
		}
	}
	if got := node.Annotations[ControllerManagedAttachAnnotation]; got != "true" {
		t.Errorf("annotation %s=%q, want true", ControllerManagedAttachAnnotation, got)
	}
	if c := readyCondition(node); c == nil || c.Status != corev1.ConditionTrue || c.Reason != NodeReadyReason {
		t.Fatalf("Ready condition %+v, want True with reason %s", c, NodeReadyReason)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { n.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	// The Lease is renewed (every second with a 4s duration) and owned by
	// the Node.
	leases := f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	var first *coordinationv1.Lease
	untilNode(t, "the node Lease", func(ctx context.Context) (bool, error) {
		first, err = leases.Get(ctx, f.NodeName, metav1.GetOptions{})
		return err == nil && first.Spec.RenewTime != nil, err
	})
	if first.Spec.HolderIdentity == nil || *first.Spec.HolderIdentity != n.identity ||
		first.Spec.LeaseDurationSeconds == nil || *first.Spec.LeaseDurationSeconds != 4 {
		t.Errorf("Lease spec %+v, want holder %s and duration 4s", first.Spec, n.identity)
	}
	untilNode(t, "the Lease to be owned by the Node and renewed", func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, f.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		owned := len(l.OwnerReferences) == 1 && l.OwnerReferences[0].UID == node.UID && l.OwnerReferences[0].Kind == "Node"
		return owned && l.Spec.RenewTime.After(first.Spec.RenewTime.Time), nil
	})

	// The node lifecycle controller marks the Node Unknown after missed
	// heartbeats; the agent sets it Ready again, keeping volumesInUse.
	inUse := `{"status":{"volumesInUse":["kubernetes.io/csi/d^h"],"conditions":[{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown","lastHeartbeatTime":"2020-01-01T00:00:00Z","lastTransitionTime":"2020-01-01T00:00:00Z"}]}}`
	if _, err := nodes.PatchStatus(ctx, f.NodeName, []byte(inUse)); err != nil {
		t.Fatal(err)
	}
	untilNode(t, "Ready=True again", func(ctx context.Context) (bool, error) {
		node, err = nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := readyCondition(node)
		return c != nil && c.Status == corev1.ConditionTrue, nil
	})
	if len(node.Status.VolumesInUse) != 1 {
		t.Errorf("volumesInUse %v after the Ready repair, want it kept", node.Status.VolumesInUse)
	}

	// A removed annotation is put back.
	if _, err := nodes.Patch(ctx, f.NodeName, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+ControllerManagedAttachAnnotation+`":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	untilNode(t, "the annotation again", func(ctx context.Context) (bool, error) {
		node, err := nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
		return err == nil && node.Annotations[ControllerManagedAttachAnnotation] == "true", err
	})

	// A deleted Node is created again, and its Lease follows the new one.
	if err := nodes.Delete(ctx, f.NodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var recreated *corev1.Node
	untilNode(t, "the Node to be created again", func(ctx context.Context) (bool, error) {
		recreated, err = nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && recreated.UID != node.UID && readyCondition(recreated) != nil, err
	})
	// The garbage collector (not running here) deletes the Lease with its
	// owner; the keeper creates it again, owned by the new Node.
	if err := leases.Delete(ctx, f.NodeName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	untilNode(t, "the Lease to be owned by the new Node", func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, f.NodeName, metav1.GetOptions{})
		return err == nil && len(l.OwnerReferences) == 1 && l.OwnerReferences[0].UID == recreated.UID, err
	})
}

func TestRegisterKeepsWhatAnExistingNodeHas(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	f.CreateNode(t, func(n *corev1.Node) {
		n.Labels["topology.example.com/zone"] = "z1"
		n.Annotations = map[string]string{"csi.volume.kubernetes.io/nodeid": `{"d":"n1"}`}
	})
	n := newNodeKeeper(f.Client, f.NodeName, 0, 0)
	registerAndRun(ctx, t, n)
	node, err := f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels["topology.example.com/zone"] != "z1" || node.Annotations["csi.volume.kubernetes.io/nodeid"] == "" {
		t.Errorf("registration dropped the Node's own labels or annotations: %v %v", node.Labels, node.Annotations)
	}
	if node.Annotations[ControllerManagedAttachAnnotation] != "true" || readyCondition(node) == nil {
		t.Errorf("existing Node not brought in line: annotations %v, conditions %v", node.Annotations, node.Status.Conditions)
	}
}

func TestRegisterFailsAtOnceWhenForbidden(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	cfg, err := f.Env.AddUser("nobody-"+f.NodeName, "no-group")
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = newNodeKeeper(client, f.NodeName, 0, 0).Register(ctx)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "registering Node "+f.NodeName) {
		t.Fatalf("Register as a user without rights: %v, want a Forbidden error naming the Node", err)
	}
}

// TestRegisterOutlastsAnAPIServerOutage is a chaos run's finding (seed
// 424242): an agent started with --register-node while the API server was
// down for longer than the backoff took to reach its cap gave up and
// exited ("registering Node ...: connection refused"). Register retries
// until the API server is back, however long its backoff has been capped.
func TestRegisterOutlastsAnAPIServerOutage(t *testing.T) {
	env, err := k8stest.Start(k8stest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	_, ctx := ktesting.NewTestContext(t)
	name := k8stest.UniqueName(t.Name())
	// The backoff reaches its cap after three attempts.
	n := newNodeKeeper(env.Client, name, 0, 0)
	n.retryBase, n.retryMax = 10*time.Millisecond, 40*time.Millisecond
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	registered := make(chan error, 1)
	go func() { registered <- n.Register(ctx) }()
	// Many capped retries fail while the API server is down.
	select {
	case err := <-registered:
		t.Fatalf("Register returned during the outage: %v", err)
	case <-time.After(time.Second):
	}
	// /readyz's reason meanwhile: not registered yet, and the last error.
	if pending, reason := n.Registering(); !pending || !strings.Contains(reason, "node "+name+" not registered yet") || !strings.Contains(reason, "refused") {
		t.Errorf("Registering during the outage = %v, %q; want true, saying the Node is not registered yet and why", pending, reason)
	}
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-registered:
		if err != nil {
			t.Fatalf("Register after the outage: %v", err)
		}
		if pending, reason := n.Registering(); pending {
			t.Errorf("Registering after Register returned = true, %q", reason)
		}
	case <-time.After(nodeWaitTimeout):
		t.Fatal("Register did not return once the API server was back")
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { n.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if _, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the Node after Register: %v", err)
	}
}

// TestKeepable: the keeper keeps a Node with the owner label and no other,
// not even one it registered itself once the label is gone (an operator
// removed it).
func TestKeepable(t *testing.T) {
	ready := func(reason string) []corev1.NodeCondition {
		return []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: reason}}
	}
	for _, tc := range []struct {
		name string
		node corev1.Node
		want bool
	}{
		{"labelled", corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{OwnerLabel: OwnerLabelValue}}}, true},
		{"labelled kubelet node", corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{OwnerLabel: OwnerLabelValue}},
			Status:     corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.34.0"}, Conditions: ready("KubeletReady")},
		}, true},
		{"registered by the agent, label removed", corev1.Node{Status: corev1.NodeStatus{Conditions: ready(NodeReadyReason)}}, false},
		{"kubelet", corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.34.0"}, Conditions: ready("KubeletReady")}}, false},
		{"kubelet version with the agent's reason", corev1.Node{Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.34.0"}, Conditions: ready(NodeReadyReason)}}, false},
		{"label with another value", corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{OwnerLabel: "kubelet"}}}, false},
		{"bare", corev1.Node{}, false},
	} {
		if got := keepable(&tc.node); got != tc.want {
			t.Errorf("%s: keepable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
