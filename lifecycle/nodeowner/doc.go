// Package nodeowner decides whether the agent is the volume manager of its
// Node. A Node has one volume manager: the kubelet's, or this agent's. The
// agent acts on a Node only while the Node carries the label
// Label=Value (set by the agent's node keeper when it registers the Node,
// by vkubelet.PrepareNode, or by a runtime beside the agent). On any other
// Node — a kubelet's — it mounts nothing and writes nothing.
//
// A Gate holds the answer. It starts closed in cluster mode and opens when
// the Node is seen with the label; it closes again when the label goes (or
// the Node is deleted). Workers wait on it before each step (Wait, woken by
// the change, never polling); a closed Gate never makes anything unmount.
//
// Fed with UIDs (ObserveNode, the node keeper's watch), the Gate pins the
// Node it serves: the first one seen with the label, or the one its owner
// created (Pin). A Node of the same name with another UID is another Node
// and keeps the Gate closed, whatever its labels. Check applies the same
// rules to a version a writer is about to write to, and Hold closes the
// Gate for a reason outside the Node (another agent renews its Lease).
package nodeowner
