package volumemanager

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeDrivers is the registry as the keeper asks it.
type fakeDrivers struct {
	registered map[string]bool
	synced     bool
}

func newExpectingKeeper(d *fakeDrivers, asNode bool) *nodeKeeper {
	k := newNodeKeeper(nil, "n", 0, 0)
	k.expectDrivers([]string{"a.csi", "b.csi"}, func(name string) bool { return d.registered[name] }, func() bool { return d.synced }, asNode)
	return k
}

// kicked tells whether the keeper asked the node controller to post the
// status again, and takes the request.
func kicked(k *nodeKeeper) bool {
	select {
	case <-k.drivers.kick:
		return true
	default:
		return false
	}
}

// TestDriversReadyCondition: as its Node, the keeper registers the Node
// without the drivers taint and NotReady naming the missing drivers, tells
// the node controller of each change, moves LastTransitionTime only when
// the status changes, and is Ready once all registered. Without node
// identity the Node is tainted and always Ready.
func TestDriversReadyCondition(t *testing.T) {
	at := func(s int64) metav1.Time { return metav1.NewTime(time.Unix(s, 0)) }
	d := &fakeDrivers{registered: map[string]bool{}}
	k := newExpectingKeeper(d, true)
	if taints := k.spec().Spec.Taints; len(taints) != 0 {
		t.Errorf("taints at registration %v, want none: the Node could never remove them", taints)
	}
	_ = kicked(k)

	c, _, changed := k.readyCondition(at(10))
	if c.Status != corev1.ConditionFalse || c.Reason != NodeDriversNotRegisteredReason || !strings.Contains(c.Message, "a.csi, b.csi") {
		t.Errorf("before any driver: %+v, want False %s naming a.csi, b.csi", c, NodeDriversNotRegisteredReason)
	}
	if changed || kicked(k) {
		t.Errorf("the same condition again told as a change")
	}
	since := c.LastTransitionTime

	d.synced, d.registered["a.csi"] = true, true
	c, _, changed = k.readyCondition(at(20))
	if c.Status != corev1.ConditionFalse || strings.Contains(c.Message, "a.csi") || !strings.Contains(c.Message, "b.csi") {
		t.Errorf("a.csi registered: %+v, want False naming b.csi only", c)
	}
	if !changed || !kicked(k) || !c.LastTransitionTime.Equal(&since) {
		t.Errorf("a.csi registered: changed %v, transition %v, want a change told and the transition at %v", changed, c.LastTransitionTime, since)
	}

	d.registered["b.csi"] = true
	c, _, changed = k.readyCondition(at(30))
	if c.Status != corev1.ConditionTrue || c.Reason != NodeReadyReason || !changed || !kicked(k) || !c.LastTransitionTime.Equal(ptrTime(at(30))) {
		t.Errorf("all registered: %+v, changed %v; want True, told, transition at 30", c, changed)
	}

	tainting := newExpectingKeeper(&fakeDrivers{registered: map[string]bool{}, synced: true}, false)
	if c, _, _ := tainting.readyCondition(at(40)); c.Status != corev1.ConditionTrue {
		t.Errorf("without node identity: %+v, want Ready", c)
	}
	if taints := tainting.spec().Spec.Taints; len(taints) != 1 || taints[0].Key != TaintDriversNotReady {
		t.Errorf("without node identity: taints %v, want %s", taints, TaintDriversNotReady)
	}
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

// TestDriversReadyAfterRestart: the keeper keeps the Ready condition it
// posted before a restart until the registry has handled the drivers found
// at start, then posts what they call for; a condition someone else set
// (Unknown) is not kept.
func TestDriversReadyAfterRestart(t *testing.T) {
	ready := func(status corev1.ConditionStatus, reason string) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(time.Unix(5, 0)),
		}}}}
	}
	d := &fakeDrivers{registered: map[string]bool{}}
	k := newExpectingKeeper(d, true)
	k.drivers.seedReady(ready(corev1.ConditionTrue, NodeReadyReason))
	c, _, changed := k.readyCondition(metav1.Now())
	if c.Status != corev1.ConditionTrue || changed || c.LastTransitionTime.Unix() != 5 {
		t.Errorf("before the registry synced: %+v, changed %v; want the Node's True kept", c, changed)
	}
	d.synced = true
	if c, _, changed := k.readyCondition(metav1.Now()); c.Status != corev1.ConditionFalse || !changed {
		t.Errorf("once synced without the drivers: %+v, changed %v; want False", c, changed)
	}

	other := newExpectingKeeper(&fakeDrivers{registered: map[string]bool{}}, true)
	other.drivers.seedReady(ready(corev1.ConditionUnknown, "NodeStatusUnknown"))
	if c, _, _ := other.readyCondition(metav1.Now()); c.Status != corev1.ConditionFalse {
		t.Errorf("after the controller's Unknown: %+v, want False", c)
	}
}
