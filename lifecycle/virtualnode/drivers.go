package virtualnode

import (
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// TaintDriversNotReady keeps new pods off a node whose expected CSI
// drivers have not all registered (Config.ExpectedDrivers): NoSchedule,
// added when the Node is registered and whenever an expected driver is
// missing, removed once all are registered.
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

// missingDrivers returns the expected drivers that are not registered.
func (n *Node) missingDrivers() []string {
	var out []string
	for _, d := range n.cfg.ExpectedDrivers {
		if n.cfg.DriverRegistered == nil || !n.cfg.DriverRegistered(d) {
			out = append(out, d)
		}
	}
	return out
}

// DriversChanged re-evaluates the drivers taint after a driver registered
// or went away. It does not block.
func (n *Node) DriversChanged() {
	if len(n.cfg.ExpectedDrivers) > 0 {
		n.queue.Add(n.cfg.NodeName)
	}
}

// hasDriversTaint says whether the Node carries TaintDriversNotReady.
func hasDriversTaint(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintDriversNotReady })
}

// taintPatch returns the patch that adds or removes TaintDriversNotReady
// as the expected drivers' registrations ask, or nil when the Node is
// right. spec.taints is replaced whole, so the patch carries the Node's
// resourceVersion: a concurrent change of the taints fails it with
// Conflict, and it is computed again from a fresh read.
func (n *Node) taintPatch(node *corev1.Node) ([]byte, error) {
	missing := n.missingDrivers()
	want := len(missing) > 0
	if want == hasDriversTaint(node) {
		return nil, nil
	}
	taints := slices.DeleteFunc(slices.Clone(node.Spec.Taints), func(t corev1.Taint) bool { return t.Key == TaintDriversNotReady })
	if want {
		taints = append(taints, corev1.Taint{Key: TaintDriversNotReady, Effect: corev1.TaintEffectNoSchedule})
	}
	data, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the taints patch: %w", err)
	}
	return data, nil
}
