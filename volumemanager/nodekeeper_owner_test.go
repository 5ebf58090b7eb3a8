package volumemanager

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// keeperUnderTest is a node keeper with a holder identity of its own and
// a logger whose lines the test reads.
type keeperUnderTest struct {
	*nodeKeeper
	ctx    context.Context
	cancel context.CancelFunc
	logs   ktesting.Buffer
	// ran is closed when Run returned; nil before register.
	ran chan struct{}
}

// newKeeperUnderTest makes a keeper of node on client with a 4s Lease
// (renewed every second) and the status posted every 200ms; it stops when
// the test ends.
func newKeeperUnderTest(t *testing.T, client kubernetes.Interface, node, identity string) *keeperUnderTest {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	k := &keeperUnderTest{nodeKeeper: newNodeKeeper(client, node, 4*time.Second, 200*time.Millisecond), ctx: ctx, cancel: cancel,
		logs: logger.GetSink().(ktesting.Underlier).GetBuffer()}
	k.identity = identity
	t.Cleanup(k.stop)
	return k
}

// register registers the keeper's Node and starts Run.
func (k *keeperUnderTest) register(t *testing.T) {
	t.Helper()
	if err := k.Register(k.ctx); err != nil {
		t.Fatal(err)
	}
	k.ran = make(chan struct{})
	go func() { defer close(k.ran); k.Run(k.ctx) }()
}

// stop ends Run and the keeper's watch, and waits for Run.
func (k *keeperUnderTest) stop() {
	k.cancel()
	if k.ran != nil {
		<-k.ran
	}
}

// errorLines returns the keeper's error lines that contain msg.
func (k *keeperUnderTest) errorLines(msg string) []string {
	var out []string
	for _, e := range k.logs.Data() {
		if e.Type == ktesting.LogError && strings.Contains(e.Message, msg) {
			out = append(out, e.Message+" "+strings.Join(kvText(e.WithKVList, e.ParameterKVList), " "))
		}
	}
	return out
}

func kvText(lists ...[]any) []string {
	var out []string
	for _, l := range lists {
		for _, v := range l {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// nodeEvents returns the Events of reason on the Node named node.
func nodeEvents(ctx context.Context, t *testing.T, client kubernetes.Interface, node, reason string) []corev1.Event {
	t.Helper()
	list, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": reason}.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// leaseHolder returns the holder identity of the Node's Lease.
func leaseHolder(ctx context.Context, t *testing.T, client kubernetes.Interface, node string) string {
	t.Helper()
	l, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// TestSecondKeeperRefusesAndNamesTheFirst: two agents keep one Node from
// two hosts (one --node-name, e.g. a cloned image). The second sees the
// first renew the Lease under another holder identity: it writes nothing,
// its Gate stays closed naming the first, it logs one error naming the
// first, and an Event on the Node says so. Once the first is gone and its
// Lease expired, a third takes the Lease over; the second still refuses
// (until restarted).
func TestSecondKeeperRefusesAndNamesTheFirst(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	cleanupNode(t, f.Client, f.NodeName)
	first := newKeeperUnderTest(t, f.Client, f.NodeName, "host-a/boot-a")
	first.register(t)
	if got := leaseHolder(ctx, t, f.Client, f.NodeName); got != "host-a/boot-a" {
		t.Fatalf("Lease holder %q, want the first keeper's identity", got)
	}

	second := newKeeperUnderTest(t, f.Client, f.NodeName, "host-b/boot-b")
	registered := make(chan error, 1)
	go func() { registered <- second.Register(second.ctx) }()
	select {
	case err := <-registered:
		if err != nil {
			t.Fatalf("the second Register: %v", err)
		}
	case <-time.After(nodeWaitTimeout):
		t.Fatal("the second Register did not give up while the first renewed the Lease")
	}
	if second.nc != nil {
		t.Error("the second keeper runs a node controller")
	}
	ok, reason := second.owner.Owned()
	if ok || !strings.Contains(reason, "host-a/boot-a") || !strings.Contains(reason, "host-b/boot-b") {
		t.Errorf("the second keeper's Gate: owned %v, reason %q; want closed, naming both holders", ok, reason)
	}
	lines := second.errorLines("another agent serves it")
	if len(lines) != 1 || !strings.Contains(lines[0], "host-a/boot-a") {
		t.Errorf("error lines of the second keeper %q, want one naming the first's holder identity", lines)
	}
	if ok, reason := first.owner.Owned(); !ok {
		t.Errorf("the first keeper's Gate closed: %s", reason)
	}
	untilNode(t, "the Event naming the first agent", func(ctx context.Context) (bool, error) {
		for _, e := range nodeEvents(ctx, t, f.Client, f.NodeName, EventNodeLeaseHeldByAnother) {
			if strings.Contains(e.Message, "host-a/boot-a") && e.Type == corev1.EventTypeWarning {
				return true, nil
			}
		}
		return false, nil
	})
	if got := leaseHolder(ctx, t, f.Client, f.NodeName); got != "host-a/boot-a" {
		t.Errorf("Lease holder %q after the second keeper, want the first's", got)
	}

	// The first stops for good; its Lease expires after 4s and a third
	// agent takes it over. The second refused for good.
	first.stop()
	third := newKeeperUnderTest(t, f.Client, f.NodeName, "host-c/boot-c")
	third.register(t)
	if got := leaseHolder(ctx, t, f.Client, f.NodeName); got != "host-c/boot-c" {
		t.Errorf("Lease holder %q, want the third keeper's after the first's expired", got)
	}
	if ok, reason := third.owner.Owned(); !ok {
		t.Errorf("the third keeper's Gate: closed, %s", reason)
	}
	if !strings.Contains(third.logs.String(), "Taking over the Node's Lease") {
		t.Errorf("the third keeper did not log the takeover:\n%s", third.logs.String())
	}
	if ok, _ := second.owner.Owned(); ok {
		t.Error("the second keeper's Gate opened")
	}
}

// TestKeeperTakesOverAStaleLeaseOnlyOnceExpired: an agent restarted on the
// same host (same holder identity) renews its Lease at once; one with
// another identity (the host rebooted) waits for a Lease that was renewed
// within its duration, and takes it once it expired without renewal.
func TestKeeperTakesOverAStaleLeaseOnlyOnceExpired(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	cleanupNode(t, f.Client, f.NodeName)
	before := newKeeperUnderTest(t, f.Client, f.NodeName, "host-a/boot-1")
	before.register(t)
	before.stop()

	// The same boot: at once.
	again := newKeeperUnderTest(t, f.Client, f.NodeName, "host-a/boot-1")
	start := time.Now()
	again.register(t)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a restart with the same identity waited %v for its own Lease", d)
	}
	again.stop()

	// A reboot (another boot ID): not before the Lease expired.
	l, err := f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rebooted := newKeeperUnderTest(t, f.Client, f.NodeName, "host-a/boot-2")
	rebooted.register(t)
	if since := time.Since(l.Spec.RenewTime.Time); since < 4*time.Second {
		t.Errorf("the Lease was taken over %v after its last renewal, within its 4s duration", since)
	}
	if got := leaseHolder(ctx, t, f.Client, f.NodeName); got != "host-a/boot-2" {
		t.Errorf("Lease holder %q, want the rebooted agent's", got)
	}
	if ok, reason := rebooted.owner.Owned(); !ok {
		t.Errorf("after the takeover the Gate is closed: %s", reason)
	}
}

// TestKeeperDoesNotAdoptANodeSomeoneElseCreated: the Node the keeper
// served is deleted and someone else creates one of the same name, with
// the owner label. The keeper's Gate closes naming both UIDs, one error
// line, an Event on the new Node; the keeper writes nothing to it (no
// status, no Lease renewal) for many status intervals. Once that Node is
// deleted, the keeper creates its own, says so (EventNodeRecreated) and
// serves it.
func TestKeeperDoesNotAdoptANodeSomeoneElseCreated(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	cleanupNode(t, f.Client, f.NodeName)
	k := newKeeperUnderTest(t, f.Client, f.NodeName, "host-a/boot-a")
	k.register(t)
	nodes := f.Client.CoreV1().Nodes()
	served, err := nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if k.owner.Pinned() != served.UID {
		t.Fatalf("pinned %q, want the created Node's UID %q", k.owner.Pinned(), served.UID)
	}

	replacement := replaceNode(t, f.Client, f.NodeName)
	untilNode(t, "the Gate to close for the new Node", func(context.Context) (bool, error) {
		ok, reason := k.owner.Owned()
		return !ok && strings.Contains(reason, string(replacement.UID)) && strings.Contains(reason, string(served.UID)), nil
	})
	untilNode(t, "EventNodeReplaced on the new Node", func(ctx context.Context) (bool, error) {
		for _, e := range nodeEvents(ctx, t, f.Client, f.NodeName, EventNodeReplaced) {
			if e.InvolvedObject.UID == replacement.UID {
				return true, nil
			}
		}
		return false, nil
	})
	lease, err := f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// 15 status intervals, 3 Lease renewals: nothing is written.
	time.Sleep(3 * time.Second)
	now, err := nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != replacement.UID || now.ResourceVersion != replacement.ResourceVersion {
		t.Errorf("the new Node was written: UID %s, resourceVersion %s -> %s, conditions %v", now.UID,
			replacement.ResourceVersion, now.ResourceVersion, now.Status.Conditions)
	}
	if l, err := f.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, f.NodeName, metav1.GetOptions{}); err != nil ||
		!l.Spec.RenewTime.Equal(lease.Spec.RenewTime) {
		t.Errorf("the Lease was renewed for a Node that is not the agent's: %v", err)
	}
	if ok, _ := k.owner.Owned(); ok {
		t.Error("the Gate opened for the new Node")
	}
	if lines := k.errorLines("another Node than the one the agent served"); len(lines) != 1 {
		t.Errorf("error lines %q, want one", lines)
	}

	// The operator deletes it: the keeper creates its own and serves it.
	if err := nodes.Delete(ctx, f.NodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var own *corev1.Node
	untilNode(t, "the keeper's own Node", func(ctx context.Context) (bool, error) {
		own, err = nodes.Get(ctx, f.NodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && own.UID != replacement.UID && own.UID != served.UID, err
	})
	untilNode(t, "the Gate to open for the keeper's Node", func(context.Context) (bool, error) {
		ok, _ := k.owner.Owned()
		return ok && k.owner.Pinned() == own.UID, nil
	})
	untilNode(t, "EventNodeRecreated on the keeper's Node", func(ctx context.Context) (bool, error) {
		for _, e := range nodeEvents(ctx, t, f.Client, f.NodeName, EventNodeRecreated) {
			if e.InvolvedObject.UID == own.UID {
				return true, nil
			}
		}
		return false, nil
	})
	if lines := k.errorLines("Created the Node again"); len(lines) != 1 {
		t.Errorf("error lines about the re-creation %q, want one", lines)
	}
}

// replaceNode deletes the Node named name and creates another of that
// name, labelled as the agent's, as someone else would (another host with
// the same name); it tries again when the keeper created its own first.
func replaceNode(t *testing.T, client kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	ctx := t.Context()
	nodes := client.CoreV1().Nodes()
	for range 20 {
		if err := nodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		created, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{corev1.LabelHostname: name, OwnerLabel: OwnerLabelValue},
		}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	t.Fatal("the keeper always created the Node first")
	return nil
}

// TestKeeperUnderNodeRestriction runs the keeper as the Node's kubelet
// would be (system:node:<name>, the Node authorizer and NodeRestriction):
// it creates its Node, keeps its Lease under its holder identity, owned by
// the Node, posts its status, creates it again when deleted and records
// its Event.
func TestKeeperUnderNodeRestriction(t *testing.T) {
	env, err := k8stest.Start(k8stest.Options{
		NodeClientSigner: true,
		APIServerFlags: map[string][]string{
			"authorization-mode":       {"Node,RBAC"},
			"enable-admission-plugins": {"NodeRestriction"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := t.Context()
	name := k8stest.UniqueName(t.Name())
	cfg, err := env.NodeConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k := newKeeperUnderTest(t, client, name, "host-a/boot-a")
	k.shape(nil, nil, []corev1.Taint{shapeTaint})
	k.register(t)
	nodes := env.Client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	untilNode(t, "the Lease owned by the Node, with the keeper's identity", func(ctx context.Context) (bool, error) {
		l, err := env.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return ptr.Deref(l.Spec.HolderIdentity, "") == "host-a/boot-a" && len(l.OwnerReferences) == 1 && l.OwnerReferences[0].UID == node.UID, nil
	})
	heartbeat := readyCondition(node).LastHeartbeatTime
	untilNode(t, "a status update", func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		return err == nil && readyCondition(n).LastHeartbeatTime.After(heartbeat.Time), err
	})
	if err := nodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	untilNode(t, "the Node created again, and its Event", func(ctx context.Context) (bool, error) {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil || n.UID == node.UID {
			return false, err
		}
		for _, e := range nodeEvents(ctx, t, env.Client, name, EventNodeRecreated) {
			if e.InvolvedObject.UID == n.UID {
				return true, nil
			}
		}
		return false, nil
	})
	if lines := k.errorLines("Cannot"); len(lines) > 0 {
		t.Errorf("the keeper failed to write: %q", lines)
	}

	// A restart keeps the Node it finds, although NodeRestriction forbids
	// it to put back a taint someone removed.
	k.stop()
	if _, err := nodes.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	restarted := newKeeperUnderTest(t, client, name, "host-a/boot-a")
	restarted.shape(nil, nil, []corev1.Taint{shapeTaint})
	restarted.register(t)
	if ok, reason := restarted.owner.Owned(); !ok {
		t.Errorf("after the restart the Gate is closed: %s", reason)
	}
	if lines := restarted.errorLines("Cannot add the configured taints"); len(lines) != 1 {
		t.Errorf("error lines about the taints %q, want one", lines)
	}
}

// TestHolderIdentity: "<hostname>/<boot ID>", the same at every call.
func TestHolderIdentity(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	id := holderIdentity()
	if !strings.HasPrefix(id, host+"/") || len(id) <= len(host)+1 {
		t.Fatalf("holderIdentity() = %q, want %s/<boot ID>", id, host)
	}
	if b, err := os.ReadFile(bootIDFile); err == nil && id != host+"/"+strings.TrimSpace(string(b)) {
		t.Errorf("holderIdentity() = %q, want the boot ID %q after the hostname", id, strings.TrimSpace(string(b)))
	}
	if again := holderIdentity(); again != id {
		t.Errorf("holderIdentity() changed: %q, then %q", id, again)
	}
}

// TestKeeperDoesNotCreateAReleasedNodeAgain: an operator removes the owner
// label, then deletes the Node: the keeper, released from it, does not
// create it again (it would carry the label again) and says so once.
func TestKeeperDoesNotCreateAReleasedNodeAgain(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	cleanupNode(t, f.Client, f.NodeName)
	k := newKeeperUnderTest(t, f.Client, f.NodeName, "host-a/boot-a")
	k.register(t)
	nodes := f.Client.CoreV1().Nodes()
	if _, err := nodes.Patch(ctx, f.NodeName, types.MergePatchType, []byte(`{"metadata":{"labels":{"`+OwnerLabel+`":null}}}`),
		metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	untilNode(t, "the Gate to close", func(context.Context) (bool, error) { ok, _ := k.owner.Owned(); return !ok, nil })
	if err := nodes.Delete(ctx, f.NodeName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// 10 status intervals.
	time.Sleep(2 * time.Second)
	if node, err := nodes.Get(ctx, f.NodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Node after its deletion: %v, labels %v; want it not created again", err, node.GetLabels())
	}
	if n := strings.Count(k.logs.String(), "Not creating the Node again"); n != 1 {
		t.Errorf("%d log lines about not creating the Node again, want 1:\n%s", n, k.logs.String())
	}
}
