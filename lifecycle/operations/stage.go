package operations

import (
	"context"
	"errors"
	"fmt"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Stage stages volume name (NodeStageVolume, as the kubelet's csi_attacher.go MountDevice) and records
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
// staged: Stage does nothing for them. A volume a container orchestrator
// staged through the front endpoint (StageRequest) is that caller's: Stage
// fails with an error wrapping volume.ErrInUse until it is unstaged. A
// volume the desired state (Config.Wanted) no longer wants once the lock is
// held is not staged: volume.ErrNotWanted, nothing recorded.
func (o *Operations) Stage(ctx context.Context, name volume.Name, src volume.Source, fsGroup *int64) (err error) {
	if src.Inline {
		return nil
	}
	if err := o.notOwned(); err != nil {
		return err
	}
	unlock, err := o.locks.lockVolume(ctx, name, true)
	if err != nil {
		return err
	}
	defer unlock()
	if err := o.volumeNotWanted(name); err != nil {
		// Decided before a teardown that held the lock: staging now would
		// bring back a volume just forgotten.
		return err
	}
	start := time.Now()
	defer func() { o.observe(src.Driver, volume.StepStage, src.AccessType, src.Migrated, start, err) }()
	s := o.beginStage(ctx, name, src.ID, false)
	s.migrated = src.Migrated

	if s.known && s.prev.External {
		return s.fail(fmt.Errorf("%w: %s is staged at %s by a container orchestrator through the front endpoint",
			volume.ErrInUse, name, s.prev.StagingPath))
	}
	client, err := o.driver(src.Driver)
	if err != nil {
		return s.fail(err)
	}
	st, err := o.layout.Staging(src.ID)
	if err != nil {
		return s.fail(err)
	}
	publishContext, err := o.publishContext(name, src, o.policies.Get(src.Driver).AttachRequired)
	if err != nil {
		return s.fail(err)
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		return s.fail(fmt.Errorf("getting the node capabilities of driver %q: %w", src.Driver, err))
	}
	p := stagePlan{
		client: client,
		site:   stagingSite{Staging: st},
		record: checkpoint.StageRecord{
			VolumeHandle: src.Handle,
			DriverName:   src.Driver,
			VolumeName:   name,
			PVName:       src.PVName,
			AccessType:   src.AccessType,
			StagingPath:  st.Path,
			// The kubelet records the context it mounted with here too.
			SELinuxMountContext: src.SELinuxContext,
		},
	}
	if caps.StageUnstage() {
		secrets, err := o.secret(ctx, src.StageSecret)
		if err != nil {
			return s.fail(err)
		}
		p.req = &csi.NodeStageVolumeRequest{
			VolumeId:          src.Handle,
			PublishContext:    publishContext,
			StagingTargetPath: st.Path,
			VolumeCapability:  capability(src, caps, fsGroup),
			Secrets:           secrets,
			VolumeContext:     src.Attributes,
		}
		if err := s.repairStaging(ctx, client, src.Handle, st.Path); err != nil {
			return err
		}
	}
	return s.run(ctx, p)
}

// repairStaging tears down a volume recorded as staged (or uncertain) whose
// staging path is a broken mount before it is staged again, in the
// kubelet's order (see brokenmount.go): NodeUnpublishVolume of every target
// of the volume, each left PublishUncertain for the reconciler to publish
// again once the volume is staged, then NodeUnstageVolume. The volume's
// exclusive lock, held, keeps every publish out meanwhile. A target that is
// a healthy mount is a running pod's: nothing is torn down, and the stage
// is repeated at the broken path as it is (the driver may replace it).
func (s *stageStep) repairStaging(ctx context.Context, client DriverClient, handle, path string) error {
	if !s.known || s.prev.Stage == volume.NotStaged || s.prev.External {
		return nil
	}
	o := s.o
	broken := o.statDead(path)
	if broken == nil {
		return nil
	}
	type target struct {
		key volume.PodKey
		pod asw.Pod
	}
	var targets []target
	for _, uid := range o.state.Publishers(s.name) {
		key := volume.PodKey{Volume: s.name, Pod: uid}
		p, ok := o.state.Pod(key)
		if !ok || p.TargetPath == "" {
			continue
		}
		if p.External || o.healthyMount(p.TargetPath) {
			s.logger.Info("Staging path is a broken mount but a pod's target is a healthy mount; staging again without unstaging",
				"stagingTargetPath", path, "podUID", uid, "targetPath", p.TargetPath)
			return nil
		}
		targets = append(targets, target{key: key, pod: p})
	}
	s.logger.Info("Staging path is a broken mount; unpublishing its targets and unstaging it before staging again",
		"stagingTargetPath", path, "targets", len(targets), "err", broken)
	for _, t := range targets {
		err := o.unpublishBroken(ctx, client, handle, t.pod.TargetPath)
		if err == nil {
			err = fmt.Errorf("%w: the staging path %s is a broken mount (%w); the target was unpublished to stage the volume again",
				ErrMountBroken, path, broken)
		}
		// Published again by the reconciler (uncertain and wanted) once the
		// volume is staged, or unpublished again when no longer wanted.
		o.state.RecordPublish(t.key, s.id, asw.PublishOutcome{Step: volume.StepUnpublish, State: volume.PublishUncertain,
			TargetPath: t.pod.TargetPath, Err: err})
		if !errors.Is(err, ErrMountBroken) {
			return s.fail(err)
		}
	}
	if err := o.unstageBroken(ctx, client, handle, path); err != nil {
		o.state.RecordStage(s.name, s.id, asw.StageOutcome{Step: volume.StepUnstage, State: volume.StageUncertain,
			StagingPath: s.prev.StagingPath, Migrated: s.migrated, Err: err})
		s.logger.V(2).Info("Unstaging a broken mount failed", "err", err)
		return err
	}
	// Nothing is staged any more: the stage that follows starts from
	// uncertain, so that its failure is not taken for "still staged".
	s.prev.Stage = volume.StageUncertain
	return nil
}

// Unstage unstages volume name (NodeUnstageVolume, as the kubelet's csi_attacher.go UnmountDevice) and, on
// success, removes the staging directory, then the staged record, and
// forgets the volume. It needs only what the actual state holds (filled from
// the staged record after a restart), no Source.
//
// It refuses with an error wrapping volume.ErrInUse while any pod's publish
// is present or uncertain (asw MayUnstage, the one rule) or while the
// staging path is still bind-mounted elsewhere (the kubelet's
// GetDeviceMountRefs check). A volume the actual state does not know is
// not staged: nothing to do; nor is one a container orchestrator staged
// through the front endpoint (UnstageRequest tears that down). A volume
// recorded NotStaged (attached only, or after a final stage error) gets no
// call: leftovers are removed and it is forgotten. A driver without
// STAGE_UNSTAGE_VOLUME gets no call either. NotFound from the driver counts
// as success. Any other error, or a staging path still mounted afterwards
// (ErrStillMounted), leaves the volume StageUncertain: staged again while
// wanted, unstaged again when not.
func (o *Operations) Unstage(ctx context.Context, name volume.Name) error {
	if err := o.notOwned(); err != nil {
		return err
	}
	return o.unstage(ctx, name, "")
}

// unstage is Unstage when callerPath is empty, and UnstageRequest for a
// container orchestrator's staging path otherwise: the same lock, rule,
// checks and outcomes, with the caller's staging path and record location.
func (o *Operations) unstage(ctx context.Context, name volume.Name, callerPath string) (err error) {
	unlock, err := o.locks.lockVolume(ctx, name, true)
	if err != nil {
		return err
	}
	defer unlock()
	external := callerPath != ""
	v, ok := o.state.Volume(name)
	if !ok || v.External != external || (external && v.StagingPath != callerPath) {
		// Not staged, or not by this caller at this path: nothing to do.
		return nil
	}
	if err := o.state.MayUnstage(name); err != nil {
		return err
	}
	start := time.Now()
	defer func() { o.observe(v.Driver, volume.StepUnstage, v.AccessType, v.Migrated, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", name, "driver", v.Driver)

	fail := func(state volume.StageState, err error) error {
		o.state.RecordStage(name, v.ID, asw.StageOutcome{Step: volume.StepUnstage, State: state, StagingPath: v.StagingPath, External: external, Err: err})
		logger.V(2).Info("Unstage failed", "state", state, "err", err)
		return err
	}
	// The reconciler's paths come from the layout, never from what was
	// recorded: a record cannot point a teardown outside the root.
	site, err := o.stagingSiteOf(v)
	if v.Stage == volume.NotStaged {
		// Nothing to call; remove what a failed stage may have left. A
		// volume without valid paths never had any.
		if err == nil {
			if err := o.removeStaging(site); err != nil {
				return fail(v.Stage, err)
			}
		}
		o.forgetVolume(name)
		logger.V(4).Info("Forgot volume that was not staged")
		return nil
	}
	if err != nil {
		return fail(v.Stage, err)
	}
	if v.StagingPath != "" && v.StagingPath != site.Path {
		logger.Info("Recorded staging path differs from the layout, using the layout's", "recorded", v.StagingPath, "stagingTargetPath", site.Path)
	}

	if site.MapDir != "" {
		// The kubelet's GetDeviceBindMountRefs check: a pod still mapped
		// (its unmap failed) keeps the block volume staged.
		devs, err := mappedDevices(site.MapDir)
		if err != nil {
			return fail(v.Stage, err)
		}
		if len(devs) > 0 {
			return fail(v.Stage, fmt.Errorf("%w: block volume %s is still mapped at %v", volume.ErrInUse, name, devs))
		}
	}
	client, err := o.driver(v.Driver)
	if err != nil {
		return fail(v.Stage, err)
	}
	// A caller's stage was sent to the driver whatever its capabilities;
	// so is its unstage.
	call := external
	if !external {
		caps, err := client.NodeCapabilities(ctx)
		if err != nil {
			return fail(v.Stage, fmt.Errorf("getting the node capabilities of driver %q: %w", v.Driver, err))
		}
		call = caps.StageUnstage()
	}
	if call {
		refs, err := o.deviceMountRefs(site.Path)
		if err != nil {
			return fail(v.Stage, fmt.Errorf("listing the mounts of %s: %w", site.Path, err))
		}
		if len(refs) > 0 {
			return fail(v.Stage, fmt.Errorf("%w: staging path %s is still mounted at %v", volume.ErrInUse, site.Path, refs))
		}
		rpcErr := alreadyDone(client.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{
			VolumeId:          v.Handle,
			StagingTargetPath: site.Path,
		}))
		if rpcErr != nil {
			return fail(volume.StageUncertain, rpcErr)
		}
	}
	if err := o.removeStaging(site); err != nil {
		return fail(volume.StageUncertain, err)
	}
	o.forgetVolume(name)
	logger.V(2).Info("Unstaged volume", "stagingTargetPath", site.Path)
	return nil
}

// stageStep is one stage step in progress, run under the volume's
// exclusive lock: what the actual state held when it began, and how it
// records a failure.
type stageStep struct {
	o    *Operations
	name volume.Name
	id   volume.ID
	// prev is the volume's entry when the step began; known says it had one.
	prev  asw.Volume
	known bool
	// external marks a step a container orchestrator asked for through the
	// front endpoint.
	external bool
	// migrated marks an in-tree volume translated to CSI.
	migrated bool
	logger   klog.Logger
}

// beginStage starts a stage step; the volume's lock must be held.
func (o *Operations) beginStage(ctx context.Context, name volume.Name, id volume.ID, external bool) *stageStep {
	s := &stageStep{o: o, name: name, id: id, external: external,
		logger: klog.FromContext(ctx).WithValues("volume", name, "driver", id.Driver)}
	s.prev, s.known = o.state.Volume(name)
	if s.known && s.id.PVName == "" {
		// A caller's request does not know the PV; keep what was recorded.
		s.id.PVName = s.prev.PVName
	}
	return s
}

// fail records an error of a step that did not reach the driver: the stage
// state stays as it was. A caller's step on a volume nobody knew records
// nothing; the caller gets the error.
func (s *stageStep) fail(err error) error {
	s.logger.V(2).Info("Stage failed before NodeStageVolume", "err", err)
	if s.external && !s.known {
		return err
	}
	s.o.state.RecordStage(s.name, s.id, asw.StageOutcome{Step: volume.StepStage, State: s.prev.Stage,
		StagingPath: s.prev.StagingPath, External: s.prev.External, Migrated: s.migrated, Err: err})
	return err
}

// stagePlan is a stage step ready to run.
type stagePlan struct {
	client DriverClient
	// site is where the volume is staged and its record kept.
	site stagingSite
	// record is written to site.Record before the call.
	record checkpoint.StageRecord
	// req is sent to the driver; nil when the driver has no stage step.
	req *csi.NodeStageVolumeRequest
}

// run writes the staged record (and, for the layout, the staging
// directory), calls NodeStageVolume and records the outcome as
// transitions.go says, cleaning up when nothing ended up staged.
func (s *stageStep) run(ctx context.Context, p stagePlan) error {
	o := s.o
	err := o.tree.write(func() error {
		if err := checkpoint.WriteStage(p.site.Record, p.record); err != nil {
			return fmt.Errorf("writing the staged record: %w", err)
		}
		if p.site.caller {
			return nil
		}
		// The staging directory need not be durable: the record is.
		return makeMountDir(p.site.Path)
	})
	if err != nil {
		return s.fail(err)
	}
	if p.req == nil {
		o.state.RecordStage(s.name, s.id, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: p.site.Path,
			External: s.external, SELinuxContext: p.record.SELinuxMountContext, Migrated: s.migrated})
		s.logger.V(2).Info("Driver has no stage step, volume counts as staged")
		return nil
	}
	rpcErr := p.client.NodeStageVolume(ctx, p.req)
	next := afterStage(s.prev.Stage, s.prev.Reconstructed, rpcErr)
	if next == volume.NotStaged {
		// Nothing is staged: take back the directory and the record, as
		// the kubelet does after a final error.
		if cleanErr := o.removeStaging(p.site); cleanErr != nil {
			s.logger.Error(cleanErr, "Failed to clean up after a final NodeStageVolume error")
		}
	}
	if next == volume.NotStaged && s.external && !s.known {
		// The caller got the error; there is nothing to remember.
		o.forgetVolume(s.name)
	} else {
		o.state.RecordStage(s.name, s.id, asw.StageOutcome{Step: volume.StepStage, State: next, StagingPath: p.site.Path,
			External: s.external, SELinuxContext: p.record.SELinuxMountContext, Migrated: s.migrated, Err: rpcErr})
	}
	if rpcErr != nil {
		s.logger.V(2).Info("NodeStageVolume failed", "state", next, "err", rpcErr)
		return rpcErr
	}
	s.logger.V(2).Info("Staged volume", "stagingTargetPath", p.site.Path)
	return nil
}
