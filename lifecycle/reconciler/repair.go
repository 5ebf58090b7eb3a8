package reconciler

import "github.com/csi-volmgr/csi-volmgr/lifecycle/volume"

// Repair hands a pod's use whose publish was found broken (and marked
// uncertain) to the pod queue at once, whatever its backoff: it is
// published again.
func (r *Reconciler) Repair(key volume.PodKey) {
	r.pods.Forget(key)
	r.pods.Add(key)
}
