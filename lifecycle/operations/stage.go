package operations

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Stage stages volume name (NodeStageVolume, reference §1.3) and records
// the outcome. fsGroup is the fsGroup of the pod the volume is staged for;
// it becomes volume_mount_group when the driver has VOLUME_MOUNT_GROUP.
//
// In order: the driver must be registered (else volume.ErrDriverNotRegistered)
// and, when its policy says attachRequired, WaitForAttach must have found the
// volume attached (else volume.ErrNotAttached); the stage Secret is read;
// the staged record is written durably (so a crash from here on leaves a
// trace that reconstruction finds, kubernetes#85476); the staging directory
// is created (0750); then NodeStageVolume is called with volume_id,
// publish_context, staging_target_path, volume_capability (access mode from
// AccessModes[0], fs_type, mount_flags, volume_mount_group), secrets and
// volume_context = Attributes. A driver without STAGE_UNSTAGE_VOLUME gets no
// call, as with the kubelet, and the volume counts as staged; its record is
// kept, because Unstage needs it.
//
// The outcome follows transitions.go. When it leaves the volume NotStaged
// (a final error on a volume that was not staged before), the staging
// directory and the record are removed again. Inline volumes are never
// staged: Stage does nothing for them.
func (o *Operations) Stage(ctx context.Context, name volume.Name, src volume.Source, fsGroup *int64) (err error) {
	if src.Inline {
		return nil
	}
	unlock, err := o.locks.lockVolume(ctx, name, true)
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	defer func() { o.observe(src.Driver, volume.StepStage, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", name, "driver", src.Driver)

	id := volumeID(src)
	prev, _ := o.state.Volume(name)
	// fail records an error of a step that did not reach the driver: the
	// stage state stays as it was.
	fail := func(err error) error {
		o.state.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: prev.Stage, StagingPath: prev.StagingPath, Err: err})
		logger.V(2).Info("Stage failed before NodeStageVolume", "err", err)
		return err
	}

	client, err := o.driver(src.Driver)
	if err != nil {
		return fail(err)
	}
	st, err := o.layout.Staging(src)
	if err != nil {
		return fail(err)
	}
	publishContext, err := o.publishContext(name, src, o.policies.Get(src.Driver).AttachRequired)
	if err != nil {
		return fail(err)
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		return fail(fmt.Errorf("getting the node capabilities of driver %q: %w", src.Driver, err))
	}
	var secrets map[string]string
	if caps.StageUnstage() {
		if secrets, err = o.secret(ctx, src.StageSecret); err != nil {
			return fail(err)
		}
	}
	err = o.tree.write(func() error {
		if err := checkpoint.WriteStage(st.Record, checkpoint.StageRecord{
			VolumeHandle: src.Handle,
			DriverName:   src.Driver,
			VolumeName:   name,
			PVName:       src.PVName,
			AccessType:   src.AccessType,
			StagingPath:  st.Path,
		}); err != nil {
			return fmt.Errorf("writing the staged record: %w", err)
		}
		return checkpoint.MkdirAll(st.Path)
	})
	if err != nil {
		return fail(err)
	}

	if !caps.StageUnstage() {
		o.state.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: st.Path})
		logger.V(2).Info("Driver has no stage step, volume counts as staged")
		return nil
	}
	rpcErr := client.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId:          src.Handle,
		PublishContext:    publishContext,
		StagingTargetPath: st.Path,
		VolumeCapability:  capability(src, caps, fsGroup),
		Secrets:           secrets,
		VolumeContext:     src.Attributes,
	})
	next := afterStage(prev.Stage, prev.Reconstructed, rpcErr)
	if next == volume.NotStaged {
		// Nothing is staged: take back the directory and the record, as
		// the kubelet does after a final error.
		if cleanErr := o.removeStaging(st); cleanErr != nil {
			logger.Error(cleanErr, "Failed to clean up after a final NodeStageVolume error")
		}
	}
	o.state.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: next, StagingPath: st.Path, Err: rpcErr})
	if rpcErr != nil {
		logger.V(2).Info("NodeStageVolume failed", "state", next, "err", rpcErr)
		return rpcErr
	}
	logger.V(2).Info("Staged volume", "stagingTargetPath", st.Path)
	return nil
}

// Unstage unstages volume name (NodeUnstageVolume, reference §1.5) and, on
// success, removes the staging directory, then the staged record, and
// forgets the volume. It needs only what the actual state holds (filled from
// the staged record after a restart), no Source.
//
// It refuses with an error wrapping volume.ErrInUse while any pod's publish
// is present or uncertain (asw MayUnstage, the one rule) or while the
// staging path is still bind-mounted elsewhere (the kubelet's
// GetDeviceMountRefs check). A volume the actual state does not know is
// not staged: nothing to do. A volume recorded NotStaged (attached only, or
// after a final stage error) gets no call: leftovers are removed and it is
// forgotten. A driver without STAGE_UNSTAGE_VOLUME gets no call either.
// NotFound from the driver counts as success. Any other error, or a staging
// path still mounted afterwards (ErrStillMounted), leaves the volume
// StageUncertain: staged again while wanted, unstaged again when not.
func (o *Operations) Unstage(ctx context.Context, name volume.Name) (err error) {
	unlock, err := o.locks.lockVolume(ctx, name, true)
	if err != nil {
		return err
	}
	defer unlock()
	v, ok := o.state.Volume(name)
	if !ok {
		return nil
	}
	if err := o.state.MayUnstage(name); err != nil {
		return err
	}
	start := time.Now()
	defer func() { o.observe(v.Driver, volume.StepUnstage, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", name, "driver", v.Driver)

	fail := func(state volume.StageState, err error) error {
		o.state.RecordStage(name, v.VolumeID, asw.StageOutcome{Step: volume.StepUnstage, State: state, StagingPath: v.StagingPath, Err: err})
		logger.V(2).Info("Unstage failed", "state", state, "err", err)
		return err
	}
	// The paths come from the layout, never from what was recorded: a
	// record cannot point a teardown outside the root.
	st, err := o.layout.Staging(sourceOf(v.VolumeID))
	if v.Stage == volume.NotStaged {
		// Nothing to call; remove what a failed stage may have left. A
		// volume without valid paths never had any.
		if err == nil {
			if err := o.removeStaging(st); err != nil {
				return fail(v.Stage, err)
			}
		}
		o.state.ForgetVolume(name)
		logger.V(4).Info("Forgot volume that was not staged")
		return nil
	}
	if err != nil {
		return fail(v.Stage, err)
	}
	if v.StagingPath != "" && v.StagingPath != st.Path {
		logger.Info("Recorded staging path differs from the layout, using the layout's", "recorded", v.StagingPath, "stagingTargetPath", st.Path)
	}

	client, err := o.driver(v.Driver)
	if err != nil {
		return fail(v.Stage, err)
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		return fail(v.Stage, fmt.Errorf("getting the node capabilities of driver %q: %w", v.Driver, err))
	}
	if caps.StageUnstage() {
		refs, err := o.mounts.GetMountRefs(st.Path)
		if err != nil {
			return fail(v.Stage, fmt.Errorf("listing the mounts of %s: %w", st.Path, err))
		}
		if len(refs) > 0 {
			return fail(v.Stage, fmt.Errorf("%w: staging path %s is still mounted at %v", volume.ErrInUse, st.Path, refs))
		}
		rpcErr := alreadyDone(client.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{
			VolumeId:          v.Handle,
			StagingTargetPath: st.Path,
		}))
		if rpcErr != nil {
			return fail(volume.StageUncertain, rpcErr)
		}
	}
	if err := o.removeStaging(st); err != nil {
		return fail(volume.StageUncertain, err)
	}
	o.state.ForgetVolume(name)
	logger.V(2).Info("Unstaged volume", "stagingTargetPath", st.Path)
	return nil
}

// removeStaging removes the staging path (unless still mounted), then the
// staged record and its directory, and prunes empty parents up to
// <root>/plugins/kubernetes.io/csi. The record goes last, so it outlives
// every other trace of the volume.
func (o *Operations) removeStaging(st paths.Staging) error {
	if err := o.tree.removeMountPoint(st.Path); err != nil {
		return err
	}
	if filepath.Dir(st.Path) != st.Dir {
		// Block: volumeDevices/staging/<pv> lives outside the record directory.
		if err := o.tree.prune(filepath.Dir(st.Path), o.layout.PluginDir()); err != nil {
			return err
		}
	}
	return o.tree.removeRecordDir(st.Record, st.Dir, o.layout.PluginDir())
}
