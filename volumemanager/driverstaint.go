package volumemanager

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
)

// TaintDriversNotReady keeps new pods off a node whose expected CSI
// drivers have not all registered (Config.ExpectedDrivers): NoSchedule,
// on the Node from its registration and whenever an expected driver is
// missing, removed once all are registered. Not under NodeIdentity:
// NodeRestriction forbids a node to change its own taints, so the agent
// acting as its Node posts Ready=False instead (driversready.go).
//
// Why a taint and not a NotReady node: the node lifecycle controller
// answers NotReady with the node.kubernetes.io/not-ready taint, NoExecute
// after the default 300s toleration, so a driver that takes five minutes
// to come back (an image pull, a crash loop) would evict every running
// pod of the node, although their volumes are mounted and fine. A NoSchedule
// taint of our own only keeps new pods away until their volumes can be
// served, and leaves the running ones alone; it is the pattern CSI drivers
// already use for their own start-up (e.g. ebs.csi.aws.com/agent-not-ready).
// Pods that must run anyway tolerate it.
const TaintDriversNotReady = "csi-volmgr.io/drivers-not-ready"

// expectedDrivers keeps the kept Node unschedulable while an expected driver
// is missing, event-driven by driver registrations (DriversChanged): with
// TaintDriversNotReady, also driven by the Node's own changes (someone
// removed or added the taint), one write per difference; or, asNode, with
// the Ready condition False (driversready.go).
type expectedDrivers struct {
	expected   []string
	registered func(name string) bool
	// synced tells whether the registry has handled every driver socket
	// found at start: until then a driver is not called missing on a Node
	// that exists (it has not had the time to register again after a
	// restart of the agent).
	synced func() bool
	// asNode is set when the agent acts as its Node (Config.NodeIdentity):
	// the Ready condition tells, the keeper writes no taint.
	asNode bool
	// queue has one key, the node's name; a burst of events is one sync.
	queue workqueue.TypedRateLimitingInterface[string]
	// kick (one slot) wakes driversProvider to send the Node's status to
	// the node controller; asNode only.
	kick chan struct{}

	// mu protects posted and logged.
	mu sync.Mutex
	// posted is the Ready condition readyCondition computed last; nil
	// before the first.
	posted *corev1.NodeCondition
	// logged is the Ready status syncReady logged last.
	logged corev1.ConditionStatus
}

// expectDrivers makes the keeper keep the Node unschedulable while one of
// drivers is not registered; registered tells whether one is, synced
// whether the registry has handled the sockets found at start. asNode
// (Config.NodeIdentity) chooses the Ready condition over the taint.
func (k *nodeKeeper) expectDrivers(drivers []string, registered func(name string) bool, synced func() bool, asNode bool) {
	if len(drivers) == 0 {
		return
	}
	k.drivers = &expectedDrivers{
		expected: slices.Clone(drivers), registered: registered, synced: synced, asNode: asNode, kick: make(chan struct{}, 1),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "csi_volmgr_drivers_taint"}),
	}
}

// DriversChanged re-evaluates the drivers taint (or the Ready condition)
// after a driver registered or went away. It does not block.
func (k *nodeKeeper) DriversChanged() {
	if k.drivers != nil {
		k.drivers.queue.Add(k.name)
	}
}

// missing returns the expected drivers that are not registered.
func (t *expectedDrivers) missing() []string {
	var out []string
	for _, d := range t.expected {
		if !t.registered(d) {
			out = append(out, d)
		}
	}
	return out
}

// initial is the taint a Node is registered with, before any driver
// could have registered; none asNode: the taint could never be removed.
func (t *expectedDrivers) initial() []corev1.Taint {
	if t == nil || t.asNode {
		return nil
	}
	return []corev1.Taint{{Key: TaintDriversNotReady, Effect: corev1.TaintEffectNoSchedule}}
}

// runDrivers keeps the taint, or the Ready condition, right until ctx
// ends.
func (k *nodeKeeper) runDrivers(ctx context.Context) {
	t := k.drivers
	if t == nil {
		return
	}
	go func() {
		<-ctx.Done()
		t.queue.ShutDown()
	}()
	logger := klog.FromContext(ctx).WithValues("node", k.name)
	if !t.asNode {
		go source.WatchNode(ctx, k.client, k.name, func(*corev1.Node) { t.queue.Add(k.name) })
		logger = logger.WithValues("taint", TaintDriversNotReady)
	}
	// The Node keeps what it shows until the drivers found at start had
	// their chance to register: a restart of the agent does not flap it.
	if err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return t.synced(), nil
	}); err != nil {
		return
	}
	t.queue.Add(k.name)
	for {
		key, shutdown := t.queue.Get()
		if shutdown {
			return
		}
		if t.asNode {
			k.syncReady(logger)
			t.queue.Forget(key)
			t.queue.Done(key)
			continue
		}
		if err := k.syncTaint(ctx, logger); err != nil && ctx.Err() == nil {
			logger.Error(err, "Cannot set the drivers taint; will retry")
			t.queue.AddRateLimited(key)
		} else {
			t.queue.Forget(key)
		}
		t.queue.Done(key)
	}
}

// syncTaint adds or removes the taint as the expected drivers'
// registrations ask. spec.taints is replaced whole, so the patch carries
// the Node's resourceVersion: a concurrent change of the taints fails it
// with Conflict, and it is computed again from a fresh read.
func (k *nodeKeeper) syncTaint(ctx context.Context, logger klog.Logger) error {
	nodes := k.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, k.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading Node %s: %w", k.name, err)
	}
	if err := k.checkWrite(node); err != nil {
		// The owner Gate said why, once; the Node's next change asks again.
		logger.V(2).Info("Not changing the drivers taint of a Node the agent does not serve", "reason", err.Error())
		return nil
	}
	missing := k.drivers.missing()
	want := len(missing) > 0
	has := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintDriversNotReady })
	if want == has {
		return nil
	}
	taints := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == TaintDriversNotReady })
	if want {
		taints = append(taints, corev1.Taint{Key: TaintDriversNotReady, Effect: corev1.TaintEffectNoSchedule})
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
	if err != nil {
		return fmt.Errorf("encoding the taints patch: %w", err)
	}
	if _, err := nodes.Patch(ctx, k.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching the taints of Node %s: %w", k.name, err)
	}
	logger.Info("Set the Node's drivers taint", "present", want, "missingDrivers", missing)
	return nil
}
