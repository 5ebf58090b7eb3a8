package volumemanager

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// Under NodeIdentity the expected drivers are reported the way a kubelet
// reports a node plugin that is not ready (its network plugin: Ready False,
// "container runtime network not ready"), because NodeRestriction forbids a
// node to change its own taints after it created its Node. The node
// lifecycle controller of the kube-controller-manager answers Ready=False
// with the taints node.kubernetes.io/not-ready:NoSchedule (TaintNodesByCondition)
// and node.kubernetes.io/not-ready:NoExecute (taint-based eviction), and
// removes both once Ready is True again. The NoExecute taint evicts the
// node's pods that do not tolerate it after their tolerationSeconds (300
// by default, DefaultTolerationSeconds); DaemonSet pods, the drivers' among
// them, tolerate it without a limit.

// readyCondition is the Ready condition the keeper posts now: True, or,
// under NodeIdentity with expected drivers, False with
// NodeDriversNotRegisteredReason while one of them is missing. Its
// LastTransitionTime moves only when its status does. A condition that
// differs from the one computed before is told to the running node
// controller (driversProvider); changed says so.
func (k *nodeKeeper) readyCondition(now metav1.Time) (cond corev1.NodeCondition, missing []string, changed bool) {
	cond = corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: NodeReadyReason, Message: NodeReadyMessage,
		LastHeartbeatTime: now, LastTransitionTime: now,
	}
	t := k.drivers
	if t == nil || !t.asNode {
		return cond, nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.posted
	if prev != nil && !t.synced() {
		// The condition the Node shows until the registry has seen the
		// drivers found at start (seedReady).
		cond = *prev.DeepCopy()
		cond.LastHeartbeatTime = now
		return cond, nil, false
	}
	if missing = t.missing(); len(missing) > 0 {
		cond.Status, cond.Reason = corev1.ConditionFalse, NodeDriversNotRegisteredReason
		cond.Message = fmt.Sprintf("csi-volmgr: CSI drivers not registered: %s (--expected-drivers)", strings.Join(missing, ", "))
	}
	if prev != nil && prev.Status == cond.Status {
		cond.LastTransitionTime = prev.LastTransitionTime
	}
	changed = prev == nil || prev.Status != cond.Status || prev.Reason != cond.Reason || prev.Message != cond.Message
	t.posted = cond.DeepCopy()
	if changed {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	return cond, missing, changed
}

// seedReady takes the Ready condition of the Node the keeper finds, when
// the agent posted it (one of its reasons), as the one it posts until the
// registry has handled the driver sockets found at start: a restart of
// the agent does not turn the Node NotReady for the moment its drivers
// take to register again. A Node created by the keeper, or whose Ready
// condition someone else set (Unknown by the node lifecycle controller
// while the agent was down), gets the condition the drivers call for.
func (t *expectedDrivers) seedReady(node *corev1.Node) {
	if t == nil || !t.asNode {
		return
	}
	for _, c := range node.Status.Conditions {
		if c.Type != corev1.NodeReady || (c.Reason != NodeReadyReason && c.Reason != NodeDriversNotRegisteredReason) {
			continue
		}
		t.mu.Lock()
		if t.posted == nil {
			t.posted = c.DeepCopy()
		}
		t.mu.Unlock()
	}
}

// syncReady computes the Ready condition after a driver registered or went
// away; the node controller posts it at once when it changed.
func (k *nodeKeeper) syncReady(logger klog.Logger) {
	cond, missing, _ := k.readyCondition(metav1.Now())
	t := k.drivers
	t.mu.Lock()
	logged := t.logged
	t.logged = cond.Status
	t.mu.Unlock()
	if logged != cond.Status {
		logger.Info("Posting the Node's Ready condition for the expected drivers", "status", cond.Status, "reason", cond.Reason,
			"missingDrivers", missing)
	}
}

// driversProvider is the node controller's NodeProvider: Ping answers as
// virtual-kubelet's NaiveNodeProvider, and under NodeIdentity with
// expected drivers each change of the Ready condition (a kick of
// readyCondition) is sent to the controller, which patches the Node's
// status at once and keeps posting that status at every interval.
type driversProvider struct{ k *nodeKeeper }

// Ping tells the node controller that the node is alive while ctx is.
func (driversProvider) Ping(ctx context.Context) error { return ctx.Err() }

// NotifyNodeStatus sends the Node, with its current Ready condition, to cb
// at every kick until ctx ends. cb, the controller's, blocks while an
// earlier Node waits in its one-slot channel: one send at a time, from
// one goroutine per controller. cb takes no context, so a send begun
// while the slot is full just as the controller stops blocks for good:
// at most this one goroutine per controller, and a controller is replaced
// only when the Node is registered again.
func (p driversProvider) NotifyNodeStatus(ctx context.Context, cb func(*corev1.Node)) {
	t := p.k.drivers
	if t == nil || !t.asNode {
		return
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.kick:
				cb(p.k.spec())
			}
		}
	}()
}
