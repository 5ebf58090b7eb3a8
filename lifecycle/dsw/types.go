package dsw

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Use is one pod's desired use of one volume.
//
// Source is the volume as this pod resolved it (its PersistentVolume, or its
// CSI inline volume). Pods that share a volume Name normally resolve equal
// Sources; they can differ only when two PersistentVolumes carry the same
// driver and handle, and then each pod's publish uses its own Source while
// the volume-level Source (Store.Volume) is one of them.
//
// The slices and maps inside Source are shared with the Store and must be
// treated as read-only.
type Use struct {
	// Name is the volume's node-wide name.
	Name volume.Name
	// Source is what the volume is, as this pod resolved it.
	Source volume.Source
	// Volume is the pod-specific part of the use.
	Volume volume.PodVolume
}

// Key returns the PodKey of the use: the unit of publish and unpublish.
func (u Use) Key() volume.PodKey {
	return volume.PodKey{Volume: u.Name, Pod: u.Volume.Pod.UID}
}

func (u Use) equal(o Use) bool {
	return u.Name == o.Name && u.Source.Equal(o.Source) && u.Volume.Equal(o.Volume)
}

// VolumeError says why one of a pod's volumes is not in the desired state,
// e.g. `PVC "ns/data" is not bound`. Err names the object at fault and
// usually wraps volume.ErrInvalidSpec.
type VolumeError struct {
	// SpecName is pod.spec.volumes[].name.
	SpecName string
	// Err is the reason.
	Err error
}

// Error renders the error as `volume "<spec name>": <reason>`.
func (e VolumeError) Error() string {
	return fmt.Sprintf("volume %q: %v", e.SpecName, e.Err)
}

// Unwrap returns the reason, for errors.Is and errors.As.
func (e VolumeError) Unwrap() error { return e.Err }

// Pod is the desired state of one pod known to the node.
type Pod struct {
	// Info identifies the pod.
	Info volume.PodInfo
	// FirstSeen is when the pod was first seen (its first event), the start
	// of the pod-event → volumes-ready latency. The Store keeps the value
	// of the pod's first SetPod.
	FirstSeen time.Time
	// Uses are the pod's desired volumes, at most one per volume Name.
	// Store.Pod returns them sorted by Name.
	Uses []Use
	// Errors are the pod's volumes that could not be resolved. Store.Pod
	// returns them sorted by SpecName.
	Errors []VolumeError
}

// UID is the pod's UID, the key of the pod in the Store.
func (p Pod) UID() types.UID { return p.Info.UID }

// Handler receives the keys whose desired state changed. Each field may be
// nil. Handlers run after the change is visible in the Store, without any
// Store lock held, possibly concurrently from several goroutines; they must
// not block (enqueue the key and return). They carry keys, not state: read
// the Store for the current state when the key is processed.
type Handler struct {
	// Volume is called when a volume enters or leaves the desired state, or
	// its volume-level Source changes.
	Volume func(name volume.Name)
	// PodVolume is called when a pod's use of a volume is added, removed or
	// changed (its Source or PodVolume).
	PodVolume func(key volume.PodKey)
	// Pod is called when a pod becomes known or unknown, or its Info, uses
	// or errors change.
	Pod func(uid types.UID)
}

// Counts are the sizes of the desired state, for metrics.
type Counts struct {
	// Pods is the number of known pods, with or without volumes.
	Pods int
	// Volumes is the number of distinct volumes.
	Volumes int
	// PodVolumes is the number of (volume, pod) uses: the kubelet's
	// volume_manager_total_volumes{state="desired_state_of_world"}.
	PodVolumes int
	// PodVolumesByDriver splits PodVolumes by CSI driver name.
	PodVolumesByDriver map[string]int
}
