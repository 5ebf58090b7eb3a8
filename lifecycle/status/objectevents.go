package status

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// More Event reasons, the kubelet's (pkg/kubelet/events) and the CSI
// external-health-monitor's.
const (
	// EventFileSystemResizeFailed: a volume mounted read-only cannot have
	// its file system grown (Warning, on the pod and the claim).
	EventFileSystemResizeFailed = "FileSystemResizeFailed"
	// EventVolumeConditionAbnormal: the driver reports an adverse health
	// condition of a pod's volume (Warning, on the pod), the reason the
	// external-health-monitor uses.
	EventVolumeConditionAbnormal = "VolumeConditionAbnormal"
	// EventVolumeRecovered: a broken mount of a pod's volume (its driver
	// restarted, a FUSE mount lost its server) was set up again (Normal,
	// on the pod). The kubelet has no such recovery.
	EventVolumeRecovered = "VolumeMountRecovered"
)

// Claim records an Event on a PersistentVolumeClaim, as the kubelet records
// resize results on both the pod and its claim.
func (e *Events) Claim(namespace, name string, uid types.UID, eventType, reason, message string) {
	ref := &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: namespace, Name: name, UID: uid}
	e.recorder.Event(ref, eventType, truncate(reason, maxReasonLength), sanitizeMessage(message))
}
