package status

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Component is the Events' source component and reporting controller.
const Component = "csi-volmgr"

// Event reasons, the kubelet's where it has one (pkg/kubelet/events). The
// agent does not attach, so the attach/detach controller's
// FailedAttachVolume and SuccessfulAttachVolume are not among them: that
// controller already records them on the pod.
const (
	// EventFailedMount: a step of mounting a filesystem volume failed
	// (Warning, on the pod).
	EventFailedMount = "FailedMount"
	// EventFailedMapVolume: a step of mapping a block volume failed
	// (Warning, on the pod).
	EventFailedMapVolume = "FailedMapVolume"
	// EventVolumeResizeFailed: NodeExpandVolume failed (Warning, on the pod).
	EventVolumeResizeFailed = "VolumeResizeFailed"
	// EventFileSystemResizeSuccessful: NodeExpandVolume succeeded (Normal,
	// on the pod).
	EventFileSystemResizeSuccessful = "FileSystemResizeSuccessful"
	// EventDriverRegistrationFailed: a CSI driver's registration was
	// rejected (Warning, on the Node). The kubelet only logs this.
	EventDriverRegistrationFailed = "DriverRegistrationFailed"
)

// EventsConfig configures Events.
type EventsConfig struct {
	// Client creates the Events. Nil records none (Events are only
	// logged at V(4)), for standalone mode without an API server.
	Client kubernetes.Interface
	// NodeName is the node this agent serves: the Events' source host and
	// the object of Node events. Required.
	NodeName string
	// Recorder, if set, receives the Events instead of a broadcaster made
	// here (e.g. record.NewFakeRecorder in callers' tests); Client is then
	// not used.
	Recorder record.EventRecorder
	// Owned, when set, tells whether the agent owns its Node; while it
	// does not, Events are dropped (logged at V(4) only).
	Owned func() (bool, string)
}

// Events records Events about pods' volumes and about the Node, through a
// client-go record.EventBroadcaster with source component "csi-volmgr" and
// host NodeName.
//
// These are core/v1 Events, as the kubelet's: the broadcaster's correlator
// aggregates similar Events and counts repeats of one Event instead of
// creating new ones (a failing mount retried with backoff is one Event
// whose count grows), kubectl describe and the tools people already use
// (field selectors on reason, source.component) see them as they see the
// kubelet's, and a pod's Events stay in the pod's namespace.
type Events struct {
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster // nil when Recorder was given
	node        *corev1.ObjectReference
	owned       func() (bool, string)
	logger      klog.Logger
}

// NewEvents starts recording Events; they stop when ctx is done or
// Shutdown is called. The logger comes from ctx.
func NewEvents(ctx context.Context, cfg EventsConfig) (*Events, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("status: EventsConfig.NodeName is required")
	}
	e := &Events{
		recorder: cfg.Recorder,
		// The kubelet's Node reference: kubectl describe node finds Node
		// Events by this UID.
		node:   &corev1.ObjectReference{Kind: "Node", Name: cfg.NodeName, UID: types.UID(cfg.NodeName)},
		owned:  cfg.Owned,
		logger: klog.FromContext(ctx),
	}
	if e.recorder == nil {
		e.broadcaster = record.NewBroadcaster(record.WithContext(ctx))
		e.broadcaster.StartStructuredLogging(4)
		if cfg.Client != nil {
			e.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.Client.CoreV1().Events("")})
		}
		e.recorder = e.broadcaster.NewRecorder(scheme.Scheme,
			corev1.EventSource{Component: Component, Host: cfg.NodeName})
	}
	return e, nil
}

// Shutdown stops recording; Events queued but not yet sent are dropped.
func (e *Events) Shutdown() {
	if e.broadcaster != nil {
		e.broadcaster.Shutdown()
	}
}

// Pod records an Event on the pod; eventType is corev1.EventTypeNormal or
// corev1.EventTypeWarning, reason one of the Event* constants. The message
// is cleaned and truncated to MaxMessageLength.
func (e *Events) Pod(pod volume.PodInfo, eventType, reason, message string) {
	if e.dropped(reason) {
		return
	}
	e.recorder.Event(podRef(pod), eventType, truncate(reason, maxReasonLength), sanitizeMessage(message))
}

// Node records an Event on this agent's Node.
func (e *Events) Node(eventType, reason, message string) {
	if e.dropped(reason) {
		return
	}
	e.recorder.Event(e.node, eventType, truncate(reason, maxReasonLength), sanitizeMessage(message))
}

// dropped tells whether an Event is dropped because the agent does not own
// its Node.
func (e *Events) dropped(reason string) bool {
	if e.owned == nil {
		return false
	}
	ok, why := e.owned()
	if !ok {
		e.logger.V(4).Info("Not recording an Event: the agent does not own the Node", "reason", reason, "why", why)
	}
	return !ok
}

// VolumeFailed records on the pod the Warning the kubelet records when b's
// step fails: FailedMount for filesystem volumes, FailedMapVolume for block
// volumes, VolumeResizeFailed for NodeExpandVolume, with the kubelet's
// message, e.g.
//
//	MountVolume.MountDevice failed for volume "pvc-1" : <error>
//
// Teardown steps record nothing, as in the kubelet, and neither does a
// Blocker without an error (a step in progress).
func (e *Events) VolumeFailed(pod volume.PodInfo, b Blocker) {
	if reason, message, ok := failureEvent(b); ok {
		e.Pod(pod, corev1.EventTypeWarning, reason, message)
	}
}

// failureEvent returns the Event reason and message for a failure of b's
// step; ok is false when no Event is recorded.
func failureEvent(b Blocker) (reason, message string, ok bool) {
	if b.Err == nil {
		return "", "", false
	}
	if errors.Is(b.Err, volume.ErrInvalidSpec) || errors.Is(b.Err, volume.ErrInvalidName) ||
		errors.Is(b.Err, volume.ErrUnreadable) {
		// The kubelet reports these in its "Unable to attach or mount
		// volumes: ... failed to process volumes=[...]" FailedMount.
		return EventFailedMount, fmt.Sprintf("Unable to attach or mount volumes: failed to process volume %q: %v",
			b.VolumeName(), b.Err), true
	}
	reason, prefix := failurePrefix(b.Step, b.Source.AccessType == volume.Block)
	if reason == "" {
		return "", "", false // teardown: no Event, as the kubelet
	}
	// The kubelet's generateVolumeMsg format, space before the colon included.
	return reason, fmt.Sprintf("%s for volume %q : %v", prefix, b.VolumeName(), b.Err), true
}

// failurePrefix returns the Event reason and the kubelet's message prefix
// for a failed step; an empty reason for steps that record no Event.
func failurePrefix(step volume.Step, block bool) (reason, prefix string) {
	switch step {
	case volume.StepWaitForAttach:
		if block {
			return EventFailedMapVolume, "MapVolume.WaitForAttach failed"
		}
		return EventFailedMount, "MountVolume.WaitForAttach failed"
	case volume.StepStage:
		if block {
			return EventFailedMapVolume, "MapVolume.SetUpDevice failed"
		}
		return EventFailedMount, "MountVolume.MountDevice failed"
	case volume.StepPublish:
		if block {
			return EventFailedMapVolume, "MapVolume.MapPodDevice failed"
		}
		return EventFailedMount, "MountVolume.SetUp failed"
	case volume.StepExpand:
		return EventVolumeResizeFailed, "MountVolume.NodeExpandVolume failed"
	case "":
		if block {
			return EventFailedMapVolume, "MapVolume failed"
		}
		return EventFailedMount, "MountVolume failed"
	}
	return "", ""
}

// podRef is the Event object reference of a pod.
func podRef(p volume.PodInfo) *corev1.ObjectReference {
	return &corev1.ObjectReference{
		Kind:       "Pod",
		APIVersion: "v1",
		Namespace:  p.Namespace,
		Name:       p.Name,
		UID:        p.UID,
	}
}
