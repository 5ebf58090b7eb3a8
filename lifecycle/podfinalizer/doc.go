// Package podfinalizer completes the deletion of a node's pods when the
// agent is the node's only agent (a node without kubelet, --register-node):
// once a pod marked for deletion has all its volumes torn down, it deletes
// the pod with grace period 0 and a UID precondition, as a kubelet's status
// manager does after the pod's containers stopped. Until then the pod stays
// in the API, so nothing re-uses its volumes before they are unmounted.
//
// "Torn down" is the kubelet's podVolumesExist: the populator let the pod go,
// the actual state holds no publish of it (published or uncertain), and no
// volume directory of it is left under <root>/pods/<uid>. Unstaging is a
// volume's, not a pod's, and may finish after the pod is gone, as the
// kubelet's UnmountDevice may.
package podfinalizer
