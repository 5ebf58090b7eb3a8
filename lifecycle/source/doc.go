// Package source is where the lifecycle's inputs come from: the pods bound
// to this node (an informer filtered by spec.nodeName) and the
// PersistentVolumeClaims, PersistentVolumes, VolumeAttachments and Node
// those pods need, each read by name only while some pod references it,
// so that the API server's cost per node grows with the node's own objects
// and never with the cluster.
//
// A referenced object is read with a GET when a pod first needs it (many
// first reads of one namespace that make up a large share of it are one
// LIST: firstread.go) and watched by name (the kubelet's watch-based
// object manager) until it settles — a claim or volume bound, an
// attachment attached. A settled object is no longer watched: it is read
// again about every Config.SettledObjectResync instead (settle.go), since
// an open watch costs the API server memory for as long as it is open and
// a fleet of agents would hold over a million of them (issue 17); a
// settled claim at least every minute (± 25 %), so that its expansion is
// seen about when the kubelet would see it. With SettledObjectResync 0
// every referenced object is watched while it is referenced.
//
// In GET-only mode (Config.GetOnly) — how the agent reads as its Node under
// the API server's Node authorizer, the way the kubelet reads — there is
// no LIST and no WATCH of these kinds: every read is a GET, and an object
// that has not settled is polled (500 ms doubling to 8 s, 500 ms again
// after a change) instead of watched. A VolumeAttachment the authorizer
// forbids counts as missing, a forbidden claim or volume as an error that
// may pass (settle.go).
//
// Reads come from these caches; changes are turned into "re-evaluate these
// pods" and "this volume's VolumeAttachment changed" notifications.
package source
