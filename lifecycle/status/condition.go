package status

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	grpcstatus "google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ConditionVolumesReady is the pod condition this agent owns on each pod it
// serves: True when every volume the pod mounts is published, False with a
// reason and message naming what blocks it.
const ConditionVolumesReady corev1.PodConditionType = "csi-volmgr.io/VolumesReady"

// Reasons of a False ConditionVolumesReady. A True condition has no reason.
const (
	// ReasonInvalidVolumeSpec: the pod, PVC or PV does not describe a usable
	// CSI volume (volume.ErrInvalidSpec, volume.ErrInvalidName).
	ReasonInvalidVolumeSpec = "InvalidVolumeSpec"
	// ReasonObjectUnreadable: the volume's PVC or PV cannot be read from
	// the API server (volume.ErrUnreadable), e.g. Forbidden.
	ReasonObjectUnreadable = "ObjectUnreadable"
	// ReasonDriverNotRegistered: the volume's CSI driver has not registered
	// on this node (volume.ErrDriverNotRegistered).
	ReasonDriverNotRegistered = "DriverNotRegistered"
	// ReasonWaitingForAttach: the VolumeAttachment is missing or not attached
	// yet (volume.ErrNotAttached).
	ReasonWaitingForAttach = "WaitingForAttach"
	// ReasonAttachFailed: waiting for attach failed otherwise, e.g. the
	// VolumeAttachment reports an attachError.
	ReasonAttachFailed = "AttachFailed"
	// ReasonVolumeAttachmentLimitExceeded: the attach failed with the
	// driver's ResourceExhausted (volume.ErrAttachLimitExceeded), the
	// kubelet's reason for failing such a pod (KEP-4876).
	ReasonVolumeAttachmentLimitExceeded = "VolumeAttachmentLimitExceeded"
	// ReasonVolumeInUse: the step waits for another pod's use of the volume
	// to end (volume.ErrInUse).
	ReasonVolumeInUse = "VolumeInUse"
	// ReasonNodeStageFailed: NodeStageVolume failed.
	ReasonNodeStageFailed = "NodeStageFailed"
	// ReasonNodePublishFailed: NodePublishVolume failed.
	ReasonNodePublishFailed = "NodePublishFailed"
	// ReasonNodeUnpublishFailed: NodeUnpublishVolume of an earlier use of
	// the volume failed, and the pod's publish waits for it.
	ReasonNodeUnpublishFailed = "NodeUnpublishFailed"
	// ReasonNodeUnstageFailed: NodeUnstageVolume failed, and the pod's
	// stage waits for it.
	ReasonNodeUnstageFailed = "NodeUnstageFailed"
	// ReasonNodeExpandFailed: NodeExpandVolume failed.
	ReasonNodeExpandFailed = "NodeExpandFailed"
	// ReasonVolumeFailed: a step this package does not know failed.
	ReasonVolumeFailed = "VolumeFailed"
	// ReasonVolumesPending: nothing failed; a step is in progress.
	ReasonVolumesPending = "VolumesPending"
	// ReasonVolumeUnhealthy is the reason of a True condition: every
	// volume is published, and a driver reports an adverse health
	// condition of one (NodeGetVolumeHealth); the message says which.
	ReasonVolumeUnhealthy = "VolumeUnhealthy"
)

// MaxMessageLength bounds condition and Event messages, in bytes: the
// limit of an Event's note in events.k8s.io/v1 (core/v1 Events and pod
// conditions have none, but neither is a place for a driver's
// multi-kilobyte error dump, which is also where a careless driver would
// echo a request's secrets).
const MaxMessageLength = 1024

// maxHandleLength bounds a volume handle quoted in a message; handles are
// driver-chosen and may be huge.
const maxHandleLength = 128

// PodVolumesStatus is the ConditionVolumesReady a caller wants on a pod.
// Build it with Ready or Blocked, or fill it directly.
type PodVolumesStatus struct {
	// Pod is the pod the condition is written on; UID, Namespace and Name
	// are required.
	Pod volume.PodInfo
	// Ready says whether every volume the pod mounts is published.
	Ready bool
	// Reason is a CamelCase reason (one of the Reason* constants); empty
	// when Ready.
	Reason string
	// Message says, for people, what blocks the pod; empty when Ready. It
	// is cleaned of control characters and truncated to MaxMessageLength.
	// It must never contain Secret data.
	Message string
	// Pending marks a status that only says a step is in progress (no
	// error): the writer holds it back for its PendingDelay, so that a pod
	// whose volumes are ready within that time gets one write, not one per
	// step.
	Pending bool
}

// Ready returns the status of a pod whose volumes are all published.
func Ready(pod volume.PodInfo) PodVolumesStatus {
	return PodVolumesStatus{Pod: pod, Ready: true}
}

// ReadyButUnhealthy returns the status of a pod whose volumes are all
// published, one of which a driver reports unhealthy: True, with
// ReasonVolumeUnhealthy and message.
func ReadyButUnhealthy(pod volume.PodInfo, message string) PodVolumesStatus {
	return PodVolumesStatus{Pod: pod, Ready: true, Reason: ReasonVolumeUnhealthy, Message: message}
}

// Blocked returns the status of a pod that waits for b.
func Blocked(pod volume.PodInfo, b Blocker) PodVolumesStatus {
	return PodVolumesStatus{Pod: pod, Reason: b.Reason(), Message: b.Message(), Pending: b.Err == nil}
}

// Blocker is the step and volume that keep a pod from being ready, and why.
type Blocker struct {
	// Step is the lifecycle step that blocks. It may be empty when the
	// volume could not be resolved at all (Err wraps volume.ErrInvalidSpec).
	Step volume.Step
	// SpecName is the pod's name for the volume (pod.spec.volumes[].name).
	SpecName string
	// Source is the volume's source; zero when the pod's volume could not
	// be resolved (e.g. its PVC is not bound).
	Source volume.Source
	// Err says why the step blocks; nil means the step is in progress. It
	// is classified with errors.Is against the volume sentinel errors.
	Err error
	// Progress, with a nil Err, says how far the step in progress has come
	// (e.g. the fsGroup ownership change of a large volume).
	Progress string
}

// VolumeName is the name messages use for the volume: the PV name for
// persistent volumes, else the pod's name for it, as the kubelet's events.
func (b Blocker) VolumeName() string {
	if b.Source.PVName != "" {
		return b.Source.PVName
	}
	return b.SpecName
}

// Reason returns the condition reason for b: the sentinel error it wraps
// decides first, then the step that failed.
func (b Blocker) Reason() string {
	switch {
	case b.Err == nil && b.Step == volume.StepWaitForAttach:
		return ReasonWaitingForAttach
	case b.Err == nil:
		return ReasonVolumesPending
	case errors.Is(b.Err, volume.ErrInvalidSpec), errors.Is(b.Err, volume.ErrInvalidName):
		return ReasonInvalidVolumeSpec
	case errors.Is(b.Err, volume.ErrUnreadable):
		return ReasonObjectUnreadable
	case errors.Is(b.Err, volume.ErrDriverNotRegistered):
		return ReasonDriverNotRegistered
	case errors.Is(b.Err, volume.ErrAttachLimitExceeded):
		return ReasonVolumeAttachmentLimitExceeded
	case errors.Is(b.Err, volume.ErrNotAttached):
		return ReasonWaitingForAttach
	case errors.Is(b.Err, volume.ErrInUse):
		return ReasonVolumeInUse
	}
	switch b.Step {
	case volume.StepWaitForAttach:
		return ReasonAttachFailed
	case volume.StepStage:
		return ReasonNodeStageFailed
	case volume.StepPublish:
		return ReasonNodePublishFailed
	case volume.StepUnpublish:
		return ReasonNodeUnpublishFailed
	case volume.StepUnstage:
		return ReasonNodeUnstageFailed
	case volume.StepExpand:
		return ReasonNodeExpandFailed
	}
	return ReasonVolumeFailed
}

// Message returns the condition message for b, e.g.
//
//	volume pvc-1 (driver hostpath.csi.k8s.io, handle 7f3c…): NodeStageVolume failed: rpc error: code = Internal desc = disk gone
//
// A CSI error is shown with the driver's gRPC code and message only; the
// full error chain belongs in the logs.
func (b Blocker) Message() string {
	return sanitizeMessage(b.subject() + ": " + b.detail())
}

// subject names the volume: its name and, when known, driver and handle.
func (b Blocker) subject() string {
	name := b.VolumeName()
	if b.Source.Driver == "" {
		return fmt.Sprintf("volume %s", name)
	}
	return fmt.Sprintf("volume %s (driver %s, handle %s)", name, b.Source.Driver,
		truncate(b.Source.Handle, maxHandleLength))
}

// detail says what happens to the volume.
func (b Blocker) detail() string {
	method := csiMethod(b.Step)
	if b.Err == nil {
		switch {
		case b.Progress != "":
			return b.Progress
		case b.Step == volume.StepWaitForAttach:
			return "waiting for the volume to be attached"
		case method != "":
			return method + " in progress"
		case b.Step != "":
			return string(b.Step) + " in progress"
		}
		return "in progress"
	}
	if method == "" || isSentinel(b.Err) {
		return b.Err.Error()
	}
	var rpc interface{ GRPCStatus() *grpcstatus.Status }
	if errors.As(b.Err, &rpc) {
		if st := rpc.GRPCStatus(); st != nil {
			return method + " failed: " + st.Err().Error()
		}
	}
	return method + " failed: " + b.Err.Error()
}

// isSentinel says whether err wraps one of the volume sentinel errors, whose
// text (written by the caller) already says what is wrong.
func isSentinel(err error) bool {
	for _, s := range []error{volume.ErrInvalidSpec, volume.ErrInvalidName, volume.ErrUnreadable, volume.ErrDriverNotRegistered,
		volume.ErrNotAttached, volume.ErrInUse} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// csiMethod is the CSI call a step makes; empty for steps that make none.
func csiMethod(step volume.Step) string {
	switch step {
	case volume.StepStage:
		return "NodeStageVolume"
	case volume.StepPublish:
		return "NodePublishVolume"
	case volume.StepUnpublish:
		return "NodeUnpublishVolume"
	case volume.StepUnstage:
		return "NodeUnstageVolume"
	case volume.StepExpand:
		return "NodeExpandVolume"
	}
	return ""
}

// sanitizeMessage makes s fit for a condition or Event: valid UTF-8, every
// run of control characters and whitespace (newlines of a driver's stack
// dump, tabs) one space, and at most MaxMessageLength bytes.
func sanitizeMessage(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	b.Grow(min(len(s), MaxMessageLength+8))
	space := false
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			space = true
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
		if b.Len() > MaxMessageLength { // enough to know it must be cut
			break
		}
	}
	return truncate(b.String(), MaxMessageLength)
}

// ellipsis marks a truncated text.
const ellipsis = "…"

// truncate cuts s to at most n bytes on a rune boundary, ending in an
// ellipsis when it cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
