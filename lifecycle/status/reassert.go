package status

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Outputs that others may overwrite (a runtime's status update that
// replaces the pod's conditions, a controller that writes the Node's
// status) are restored on the next event of the object that shows them
// changed, never on a timer: an object nobody touches costs nothing, and
// an overwrite costs one write back, held to the writer's rate limit.

// Recheck compares the condition on the pod as the informer cache now shows
// it with the condition last written; when someone changed or removed it,
// the wanted condition is written again. Call it on every change of the
// pod; it does not block. A pod whose condition was never written (or
// whose write is still held back) is left to its pending write.
func (w *PodConditions) Recheck(uid types.UID) {
	if w.cachedPod == nil {
		return
	}
	w.mu.Lock()
	want, wanted := w.desired[uid]
	written, haveWritten := w.written[uid]
	w.mu.Unlock()
	if !wanted || !haveWritten {
		return
	}
	cur := w.cachedCondition(want.Pod)
	if cur != nil && cur.Status == written.Status && cur.Reason == written.Reason && cur.Message == written.Message {
		return
	}
	w.mu.Lock()
	if w.written[uid] == written {
		delete(w.written, uid)
	}
	w.mu.Unlock()
	w.queue.Add(string(uid))
}

// NodeChanged compares the Node's status.volumesInUse with the set last
// written; when someone changed it, the wanted set is written again. Call
// it on every change of the Node; it does not block. What the Node shows
// becomes what Reported answers until then: a volume someone removed from
// the list is not protected from detach, and waits for the write back.
func (v *VolumesInUse) NodeChanged(node *corev1.Node) {
	if node == nil || node.Name != v.nodeName {
		return
	}
	observed := make([]volume.Name, 0, len(node.Status.VolumesInUse))
	for _, n := range node.Status.VolumesInUse {
		observed = append(observed, volume.Name(n))
	}
	observed = normalize(observed)
	v.mu.Lock()
	if v.reported == nil || slices.Equal(v.reported, observed) {
		v.mu.Unlock()
		return
	}
	v.reported = observed
	v.mu.Unlock()
	v.queue.Add(inUseKey)
}
