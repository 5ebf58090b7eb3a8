package volumemanager

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// podWaiters keeps the latest VolumesReady status of every pod in the
// desired state and wakes the goroutines that wait for a pod's volumes
// (WaitForAttachAndMount, WaitForUnmount) each time the lifecycle reports a
// change of that pod: no polling.
type podWaiters struct {
	mu sync.Mutex
	// status is the latest status of each pod in the desired state.
	status map[types.UID]status.PodVolumesStatus
	// names are the pods of status and those whose volumes are still being
	// torn down, for people (the status API names pods, not only UIDs).
	names map[types.UID]volume.PodInfo
	// held counts the publishes the actual state holds of a pod.
	held func(uid types.UID) int
	// changed holds, per pod with waiters, the channel closed at the pod's
	// next change, and how many waiters hold it.
	changed map[types.UID]*waitEntry
}

type waitEntry struct {
	ch   chan struct{}
	refs int
}

var _ lifecycle.PodObserver = &podWaiters{}

func newPodWaiters(held func(uid types.UID) int) *podWaiters {
	return &podWaiters{
		status:  map[types.UID]status.PodVolumesStatus{},
		names:   map[types.UID]volume.PodInfo{},
		changed: map[types.UID]*waitEntry{},
		held:    held,
	}
}

// PodVolumesChanged records the pod's status and wakes its waiters.
func (w *podWaiters) PodVolumesChanged(s status.PodVolumesStatus) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status[s.Pod.UID] = s
	w.names[s.Pod.UID] = s.Pod
	w.wakeLocked(s.Pod.UID)
}

// PodVolumesLeaving forgets the pod's status, and its name once its
// volumes are torn down, and wakes its waiters.
func (w *podWaiters) PodVolumesLeaving(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.status, uid)
	if w.held(uid) == 0 {
		delete(w.names, uid)
	}
	w.wakeLocked(uid)
}

func (w *podWaiters) wakeLocked(uid types.UID) {
	if e, ok := w.changed[uid]; ok {
		close(e.ch)
		delete(w.changed, uid)
	}
}

// lastStatus returns the pod's latest status; false when the pod is not in
// the desired state.
func (w *podWaiters) lastStatus(uid types.UID) (status.PodVolumesStatus, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.status[uid]
	return s, ok
}

// name returns the pod's namespace and name, if known.
func (w *podWaiters) name(uid types.UID) (volume.PodInfo, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	info, ok := w.names[uid]
	return info, ok
}

// uids returns the pods with a status or a name.
func (w *podWaiters) uids() []types.UID {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]types.UID, 0, len(w.names))
	for uid := range w.names {
		out = append(out, uid)
	}
	return out
}

// uidOf returns the UID of the pod namespace/name: the one in the desired
// state if any, else one whose volumes are being torn down; "" if none.
func (w *podWaiters) uidOf(namespace, name string) types.UID {
	w.mu.Lock()
	defer w.mu.Unlock()
	var found types.UID
	for uid, info := range w.names {
		if info.Namespace != namespace || info.Name != name {
			continue
		}
		if _, desired := w.status[uid]; desired {
			return uid
		}
		found = uid
	}
	return found
}

// next returns a channel closed at the pod's next change, and the function
// that releases it. Take it before reading the state it guards, so that no
// change between the read and the wait is missed.
func (w *podWaiters) next(uid types.UID) (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.changed[uid]
	if !ok {
		e = &waitEntry{ch: make(chan struct{})}
		w.changed[uid] = e
	}
	e.refs++
	return e.ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		e.refs--
		if cur, ok := w.changed[uid]; ok && cur == e && e.refs == 0 {
			delete(w.changed, uid)
		}
	}
}
