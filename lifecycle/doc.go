// Package lifecycle wires the volume lifecycle of one node from one Config:
// reconstruction of the actual state at start, the node-scoped sources and
// the populator that build the desired state, the operations that run the
// CSI steps, the reconciler that drives them, and the outputs people look
// at (pod conditions, Events, node.status.volumesInUse, metrics). The
// packages below it each do one of these jobs; Manager only connects them.
package lifecycle
