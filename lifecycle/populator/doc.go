// Package populator turns the node's pods into the desired state of world:
// for every volume some container mounts or maps, it resolves PVC → PV (with
// the kubelet's checks), generic ephemeral and CSI inline volumes into a
// volume Source and the pod's use of it, and records a human-readable
// reason for every volume that cannot be resolved. It is driven by the
// Source's events through a workqueue keyed by pod, never by polling.
package populator
