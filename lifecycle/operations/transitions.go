package operations

import (
	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// The kubelet's uncertain-state machine (operation_generator.go
// markDeviceErrorState, markVolumeErrorState and the teardown error
// paths), as pure functions of
// the state before the CSI call, the reconstructed mark and the call's
// error. Failures before the CSI call (driver not registered, a Secret that
// cannot be read, a directory that cannot be made) never reach these
// functions: the step did not start and the state stays as it was.
//
// Set-up (NodeStageVolume, NodePublishVolume):
//
//	before \ error    nil        uncertain   final
//	Not               Done       Uncertain   Not
//	Uncertain         Done       Uncertain   Not (Uncertain if reconstructed)
//	Done              Done       Done        Done
//
// A repeated set-up of something already done (a restart, a republish) that
// fails does not undo it. An error that is neither final nor uncertain (not
// classified by csiclient) counts as uncertain.
//
// Tear-down (NodeUnstageVolume, NodeUnpublishVolume): success or
// csiclient.ErrAlreadyDone ends the entry (the caller forgets it); any
// other error leaves it Uncertain, whatever it was, because the tear-down
// may have happened in part (#100182): it is set up again while wanted and
// torn down again when not.

// afterStage returns the stage state after NodeStageVolume returned err.
func afterStage(prev volume.StageState, reconstructed bool, err error) volume.StageState {
	switch {
	case err == nil, prev == volume.Staged:
		return volume.Staged
	case !csiclient.IsFinal(err):
		return volume.StageUncertain
	case prev == volume.StageUncertain && reconstructed:
		return volume.StageUncertain
	}
	return volume.NotStaged
}

// afterPublish returns the publish state after NodePublishVolume returned
// err.
func afterPublish(prev volume.PublishState, reconstructed bool, err error) volume.PublishState {
	switch {
	case err == nil, prev == volume.Published:
		return volume.Published
	case !csiclient.IsFinal(err):
		return volume.PublishUncertain
	case prev == volume.PublishUncertain && reconstructed:
		return volume.PublishUncertain
	}
	return volume.NotPublished
}
