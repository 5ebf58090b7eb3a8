package reconciler

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// DesiredState is the desired state of world; *dsw.Store implements it.
type DesiredState interface {
	// Volume returns the volume-level Source of a wanted volume.
	Volume(name volume.Name) (volume.Source, bool)
	// VolumePods returns the pods that want the volume.
	VolumePods(name volume.Name) []types.UID
	// PodVolume returns one pod's desired use of a volume.
	PodVolume(key volume.PodKey) (dsw.Use, bool)
	// Pod returns a known pod's desired state.
	Pod(uid types.UID) (dsw.Pod, bool)
	// Volumes returns every wanted volume.
	Volumes() []volume.Name
}

// ActualState is what the reconciler reads of the actual state of world;
// *asw.World implements it. Only lifecycle/operations writes it.
type ActualState interface {
	// Volume returns what is recorded about a volume.
	Volume(name volume.Name) (asw.Volume, bool)
	// Pod returns what is recorded about one pod's publish of a volume.
	Pod(key volume.PodKey) (asw.Pod, bool)
	// Publishers returns the pods whose publish is present or uncertain.
	Publishers(name volume.Name) []types.UID
	// VolumeNames returns every volume the actual state knows.
	VolumeNames() []volume.Name
	// VolumesInUse returns the volumes to report in node.status.volumesInUse.
	VolumesInUse() []volume.Name
}

// Operations runs one CSI step per call and records its outcome in the
// actual state; *operations.Operations implements it.
type Operations interface {
	// WaitForAttach checks the volume's VolumeAttachment.
	WaitForAttach(ctx context.Context, name volume.Name, src volume.Source) error
	// Stage stages the volume (NodeStageVolume).
	Stage(ctx context.Context, name volume.Name, src volume.Source, fsGroup *int64) error
	// Publish publishes one pod's use (NodePublishVolume).
	Publish(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) error
	// Unpublish tears one pod's use down (NodeUnpublishVolume).
	Unpublish(ctx context.Context, key volume.PodKey) error
	// Unstage unstages the volume (NodeUnstageVolume).
	Unstage(ctx context.Context, name volume.Name) error
}

// Gate tells the workers when they may run steps: while the agent owns
// its Node; *nodeowner.Gate implements it.
type Gate interface {
	// Wait returns nil once steps may run, or ctx's error when ctx ends
	// first.
	Wait(ctx context.Context) error
}

// Policies gives a driver's CSIDriver policy.
type Policies interface {
	// Get returns the named driver's policy.
	Get(driverName string) volume.Policy
}

// Drivers says whether a driver is registered; the registry implements it.
type Drivers interface {
	// Registered reports whether the named driver is registered now.
	Registered(name string) bool
}

// StatusWriter receives the VolumesReady status of pods;
// *status.PodConditions implements it. Nil writes nothing.
type StatusWriter interface {
	// Set records the latest status of a pod.
	Set(s status.PodVolumesStatus)
	// Forget drops a pod that is gone.
	Forget(uid types.UID)
}

// EventRecorder records Events for failed steps; *status.Events implements
// it. Nil records nothing.
type EventRecorder interface {
	// VolumeFailed records the failure of a pod's volume.
	VolumeFailed(pod volume.PodInfo, b status.Blocker)
}

// InUseReporter publishes node.status.volumesInUse; *status.VolumesInUse
// implements it. Nil (standalone mode) reports nothing and never gates.
type InUseReporter interface {
	// Set gives the volumes in use now.
	Set(names []volume.Name)
	// Reported says whether name has been written to the Node.
	Reported(name volume.Name) bool
}

// RuntimeHolds says whether a runtime still holds a pod that left the
// desired state: its containers may still run, so its volumes stay;
// *runtimepods.Pods implements it.
type RuntimeHolds interface {
	// Held says whether the volumes of the pod, which is not in the
	// desired state, must stay, and why. A held pod's release enqueues its
	// keys (PodReleased).
	Held(uid types.UID) (reason string, held bool)
}

// ReadyObserver is told when a pod's volumes first became ready; nil
// records nothing.
type ReadyObserver interface {
	// ObservePodReady records that all the pod's volumes were published at
	// ready, for a pod first seen (its first informer event) at firstSeen.
	ObservePodReady(pod volume.PodInfo, firstSeen, ready time.Time)
}
