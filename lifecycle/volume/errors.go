package volume

import "errors"

// Sentinel errors shared by the lifecycle packages. Wrap them with %w and
// test them with errors.Is; only driver/ turns them into gRPC codes.
var (
	// ErrDriverNotRegistered means the volume's CSI driver has not registered
	// (yet). Transient: retried when the driver registers.
	ErrDriverNotRegistered = errors.New("CSI driver is not registered")
	// ErrNotAttached means the VolumeAttachment is missing or not attached yet.
	// Transient: retried when the VolumeAttachment changes.
	ErrNotAttached = errors.New("volume is not attached yet")
	// ErrInvalidName means a name would escape the agent's root directory or is
	// otherwise unusable in a path. Final for the pod.
	ErrInvalidName = errors.New("invalid name")
	// ErrInvalidSpec means the pod, PVC or PV does not describe a usable CSI
	// volume (missing PV, wrong mode, not bound, ...). Final until the
	// objects change.
	ErrInvalidSpec = errors.New("invalid volume specification")
	// ErrUnreadable means an object the volume needs (its PVC or PV) cannot
	// be read: the API server answers with an error other than NotFound
	// (Forbidden, say). The pod is resolved without the volume, and read
	// again with backoff; a volume it has is kept.
	ErrUnreadable = errors.New("an object the volume needs cannot be read")
	// ErrNotStaged means a publish needs the volume staged first (the driver
	// has STAGE_UNSTAGE_VOLUME and the stage is not done, or uncertain).
	// Transient: retried once the volume is staged.
	ErrNotStaged = errors.New("volume is not staged yet")
	// ErrInUse means the step must wait for another pod's use of the volume to
	// end (e.g. ReadWriteOncePod, or unstage while published).
	ErrInUse = errors.New("volume is in use")
	// ErrNotFound means the volume is not staged or published on this node
	// at the path a caller named (e.g. NodeGetVolumeStats or NodeExpandVolume
	// through the front endpoint). Final until the caller publishes it.
	ErrNotFound = errors.New("volume not found on this node")
	// ErrAttachLimitExceeded means the attach failed because the node has
	// as many volumes attached as its driver allows (the VolumeAttachment's
	// attachError has errorCode ResourceExhausted, KEP-4876): the kubelet's
	// VolumeAttachLimitExceededError. Final for the pod until a volume is
	// detached or the limit grows.
	ErrAttachLimitExceeded = errors.New("the node's volume attach limit is exceeded")
	// ErrNotWanted means a stage or publish was refused because the desired
	// state no longer wants the volume or the pod's use of it when the step
	// got its lock: it was decided from an older view (a side loop's
	// snapshot, a teardown that ran meanwhile). Nothing was done or
	// recorded; the step is dropped.
	ErrNotWanted = errors.New("no longer wanted by the desired state")
)
