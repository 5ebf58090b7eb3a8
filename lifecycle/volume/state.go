package volume

// StageState is what the actual state knows about a volume's NodeStageVolume.
type StageState int

const (
	// NotStaged means no stage was done, or the last unstage succeeded.
	NotStaged StageState = iota
	// StageUncertain means a stage or unstage may still be in progress, or the
	// state was reconstructed after a restart. It is staged again while
	// wanted, and unstaged when no pod wants it.
	StageUncertain
	// Staged means NodeStageVolume succeeded (or the driver has no stage step).
	Staged
)

func (s StageState) String() string {
	switch s {
	case NotStaged:
		return "NotStaged"
	case StageUncertain:
		return "StageUncertain"
	case Staged:
		return "Staged"
	}
	return "Unknown"
}

// PublishState is what the actual state knows about one pod's
// NodePublishVolume of a volume.
type PublishState int

const (
	// NotPublished means no publish was done, or the last unpublish succeeded.
	NotPublished PublishState = iota
	// PublishUncertain means a publish or unpublish may still be in progress, or
	// the state was reconstructed. It is not "ready" for the pod, but it is
	// torn down when the pod goes.
	PublishUncertain
	// Published means NodePublishVolume succeeded.
	Published
)

func (s PublishState) String() string {
	switch s {
	case NotPublished:
		return "NotPublished"
	case PublishUncertain:
		return "PublishUncertain"
	case Published:
		return "Published"
	}
	return "Unknown"
}

// Step names a lifecycle step, in logs, metrics (operation_name), conditions
// and events.
type Step string

// The steps of the lifecycle, named as the kubelet's operations where one exists.
const (
	StepWaitForAttach Step = "verify_controller_attached_volume"
	StepStage         Step = "mount_device"
	StepPublish       Step = "volume_mount"
	StepUnpublish     Step = "volume_unmount"
	StepUnstage       Step = "unmount_device"
	StepExpand        Step = "expand_volume"
	// StepApplyAccessControl is the recursive fsGroup ownership change
	// after a publish (the kubelet's FSGroupCompleteHook operation).
	StepApplyAccessControl Step = "volume_apply_access_control"
)
