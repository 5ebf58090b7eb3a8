package operations

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Publish publishes volume key.Volume for pod key.Pod (NodePublishVolume,
// the kubelet's csi_mounter.go SetUpAt) and records the outcome. src is the volume, pv the pod's
// use of it.
//
// Before the call, each failing with the state unchanged: the driver must
// be registered (volume.ErrDriverNotRegistered) and support the volume's
// lifecycle mode (Persistent, or Ephemeral for inline; volume.ErrInvalidSpec);
// with STAGE_UNSTAGE_VOLUME a PV volume must be Staged (volume.ErrNotStaged);
// with attachRequired it must be attached (volume.ErrNotAttached); a
// ReadWriteOncePod volume must have no other pod's publish present or
// uncertain (volume.ErrInUse); the publish Secret and any service account
// tokens are fetched. Then the publish record is written durably, the target's
// parent directory is created (0750) and NodePublishVolume is called with
// volume_id, target_path, staging_target_path (only with STAGE_UNSTAGE, never
// for inline volumes), readonly, publish_context, volume_capability, secrets
// and volume_context (attributes, pod info when podInfoOnMount, tokens).
//
// The outcome follows transitions.go; when it leaves the pod NotPublished
// (a final error on a first publish), the record and directories are
// removed again and the pod's entry keeps only the error.
//
// Publishes of different pods of a staged volume run in parallel; a
// ReadWriteOncePod volume's publishes, and those of a driver without
// STAGE_UNSTAGE_VOLUME, run one at a time (see locks and mountsInPublish).
//
// A filesystem volume with an SELinux context is published with
// context="..." among its mount flags, and refused while the volume is
// staged with another context. After a successful NodePublishVolume, a
// block volume is mapped in the kubelet's layout (block.go), and a
// filesystem volume's files are given to the pod's fsGroup when the driver
// cannot do it (fsgroup.go; Interrupt stops that for a pod that went). The
// actual state records how the volume is presented to the pod (device
// path, SELinux context). A use the desired state (Config.Wanted) no longer
// wants once the lock is held is not published: volume.ErrNotWanted,
// nothing recorded.
func (o *Operations) Publish(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) (err error) {
	if err := o.notOwned(); err != nil {
		return err
	}
	rwop := isReadWriteOncePod(src.AccessModes)
	unlock, err := o.locks.lockPod(ctx, key, rwop || o.mountsInPublish(ctx, src.Driver, src.Inline))
	if err != nil {
		return err
	}
	defer unlock()
	if err := o.useNotWanted(key); err != nil {
		// Decided before the pod left (a republish due at its deletion):
		// no NodePublishVolume for a pod that is gone.
		return err
	}
	start := time.Now()
	defer func() { o.observe(src.Driver, volume.StepPublish, src.AccessType, src.Migrated, start, err) }()
	s := o.beginPublish(ctx, key, src.ID, false)
	s.migrated = src.Migrated
	s.logger = s.logger.WithValues("pod", klog.KRef(pv.Pod.Namespace, pv.Pod.Name))

	client, err := o.driver(src.Driver)
	if err != nil {
		return s.fail(err)
	}
	pol := o.policies.Get(src.Driver)
	mode := storagev1.VolumeLifecyclePersistent
	if src.Inline {
		mode = storagev1.VolumeLifecycleEphemeral
	}
	if !pol.SupportsLifecycleMode(mode) {
		return s.fail(fmt.Errorf("%w: driver %q does not support %s volumes (CSIDriver volumeLifecycleModes %v)",
			volume.ErrInvalidSpec, src.Driver, mode, pol.VolumeLifecycleModes))
	}
	pub, err := o.layout.Publishing(key.Pod, pv.PublishName(src), src.AccessType)
	if err != nil {
		return s.fail(err)
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		return s.fail(fmt.Errorf("getting the node capabilities of driver %q: %w", src.Driver, err))
	}
	stagingPath := ""
	if !src.Inline && caps.StageUnstage() {
		v, ok := o.state.Volume(key.Volume)
		if !ok || v.Stage != volume.Staged {
			return s.fail(fmt.Errorf("%w: %s", volume.ErrNotStaged, key.Volume))
		}
		if v.SELinuxContext != src.SELinuxContext {
			// One mount, one context: the volume is staged again once the
			// pods of the other context are gone.
			return s.fail(fmt.Errorf("%w: %s is staged with SELinux context %q, the pod needs %q",
				volume.ErrInUse, key.Volume, v.SELinuxContext, src.SELinuxContext))
		}
		stagingPath = v.StagingPath
	}
	publishContext, err := o.publishContext(key.Volume, src, pol.AttachRequired)
	if err != nil {
		return s.fail(err)
	}
	if rwop {
		for _, uid := range o.state.Publishers(key.Volume) {
			if uid != key.Pod {
				return s.fail(fmt.Errorf("%w: %s uses the ReadWriteOncePod access mode and is already published for pod %s",
					volume.ErrInUse, key.Volume, uid))
			}
		}
	}
	secrets, err := o.secret(ctx, src.PublishSecret)
	if err != nil {
		return s.fail(err)
	}
	volCtx, secrets, err := o.publishContexts(ctx, src, pv, pol, secrets)
	if err != nil {
		return s.fail(err)
	}
	var after func() error
	afterStep := volume.StepPublish
	switch {
	case src.AccessType == volume.Block:
		after = func() error { return o.mapBlock(pub) }
	case ownershipNeeded(src, pv, pol, caps):
		// Registered before the call, so that a pod deleted meanwhile
		// interrupts the change before it starts.
		walkCtx, release := o.owners.register(ctx, key)
		defer release()
		afterStep = volume.StepApplyAccessControl
		after = func() error { return o.changeOwnership(walkCtx, key, src.ID, pub.Target, pv) }
	}
	if err := s.repairTarget(ctx, client, src.Handle, pub.Target); err != nil {
		return err
	}
	return s.run(ctx, publishPlan{
		presentation: volume.Presentation{DevicePath: pub.DeviceLink, SELinuxContext: src.SELinuxContext},
		after:        after,
		afterStep:    afterStep,
		client:       client,
		site:         publishingSite{Publishing: pub},
		record: checkpoint.PublishRecord{
			SpecVolID:           pv.PublishName(src),
			VolumeHandle:        src.Handle,
			DriverName:          src.Driver,
			NodeName:            o.nodeName,
			AttachmentID:        volume.AttachmentName(src.Handle, src.Driver, o.nodeName),
			VolumeLifecycleMode: mode,
			VolumeName:          key.Volume,
			PodUID:              key.Pod,
			AccessType:          src.AccessType,
			TargetPath:          pub.Target,
			SELinuxMountContext: src.SELinuxContext,
		},
		req: &csi.NodePublishVolumeRequest{
			VolumeId:          src.Handle,
			PublishContext:    publishContext,
			StagingTargetPath: stagingPath,
			TargetPath:        pub.Target,
			VolumeCapability:  capability(src, caps, pv.FSGroup),
			Readonly:          pv.ReadOnly,
			Secrets:           secrets,
			VolumeContext:     volCtx,
		},
	})
}

// Unpublish unpublishes volume key.Volume for pod key.Pod
// (NodeUnpublishVolume(volume_id, target_path), the kubelet's csi_mounter.go TearDownAt) and, on
// success, removes the target, the publish record and the pod's directories
// that became empty, and forgets the pod's entry. It needs only what the
// actual state holds (filled from the publish record after a restart), no
// Source; the target path is checked against the layout.
//
// A pod entry the actual state does not know has nothing to unpublish, nor
// has one a container orchestrator published through the front endpoint
// (UnpublishRequest tears that down). An entry left NotPublished by a
// failed publish gets no call: leftovers are removed and the entry is
// forgotten. NotFound from the driver counts as success. Any other error, or
// a target still mounted afterwards (ErrStillMounted), leaves the publish
// uncertain: the pod's volume is published again while wanted and
// unpublished again when not.
func (o *Operations) Unpublish(ctx context.Context, key volume.PodKey) error {
	if err := o.notOwned(); err != nil {
		return err
	}
	return o.unpublish(ctx, key, "")
}

// unpublish is Unpublish when callerTarget is empty, and UnpublishRequest
// for a container orchestrator's target path otherwise: the same locks,
// calls and outcomes, with the caller's target and record location.
func (o *Operations) unpublish(ctx context.Context, key volume.PodKey, callerTarget string) (err error) {
	exclusive := false
	if v, ok := o.state.Volume(key.Volume); ok {
		exclusive = o.mountsInPublish(ctx, v.Driver, key.Volume.IsInline())
	}
	unlock, err := o.locks.lockPod(ctx, key, exclusive)
	if err != nil {
		return err
	}
	defer unlock()
	external := callerTarget != ""
	p, ok := o.state.Pod(key)
	if !ok || p.External != external || (external && p.TargetPath != callerTarget) {
		// Not published, or not by this caller at this target.
		return nil
	}
	v, _ := o.state.Volume(key.Volume)
	start := time.Now()
	defer func() { o.observe(v.Driver, volume.StepUnpublish, v.AccessType, v.Migrated, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", key.Volume, "driver", v.Driver, "podUID", key.Pod)

	fail := func(state volume.PublishState, err error) error {
		o.state.RecordPublish(key, v.ID, asw.PublishOutcome{Step: volume.StepUnpublish, State: state, TargetPath: p.TargetPath, External: external, Err: err})
		logger.V(2).Info("Unpublish failed", "state", state, "err", err)
		return err
	}
	if p.TargetPath == "" {
		// A publish that failed before its target was known left nothing.
		o.forgetPod(key)
		return nil
	}
	var site publishingSite
	var parsed paths.PodVolume
	if external {
		site, err = o.callerPublishing(v.ID, key, p.TargetPath)
	} else {
		parsed, err = o.layout.ParseTarget(p.TargetPath)
		site = publishingSite{Publishing: parsed.Publishing}
	}
	if err != nil {
		return fail(p.State, err)
	}
	switch {
	case external:
	case parsed.AccessType == volume.Filesystem:
		// The kubelet's CleanSubPaths, before TearDown.
		dir, err := o.layout.SubPaths(parsed.Pod, parsed.PublishName)
		if err == nil {
			err = o.cleanSubPaths(dir)
		}
		if err != nil {
			return fail(p.State, err)
		}
	case parsed.AccessType == volume.Block:
		// The kubelet's UnmapBlockVolume, before UnmapPodDevice.
		if err := o.unmapBlock(parsed.Publishing); err != nil {
			return fail(p.State, err)
		}
	}
	if p.State != volume.NotPublished {
		handle, driver := v.Handle, v.Driver
		if handle == "" || driver == "" {
			rec, err := checkpoint.ReadPublish(site.Record)
			if err != nil {
				return fail(p.State, fmt.Errorf("no volume handle recorded for %s: %w", key, err))
			}
			handle, driver = rec.VolumeHandle, rec.DriverName
		}
		client, err := o.driver(driver)
		if err != nil {
			return fail(p.State, err)
		}
		rpcErr := alreadyDone(client.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{
			VolumeId:   handle,
			TargetPath: p.TargetPath,
		}))
		if rpcErr != nil {
			return fail(volume.PublishUncertain, rpcErr)
		}
	}
	if err := o.removePublishing(site); err != nil {
		return fail(volume.PublishUncertain, err)
	}
	o.forgetPod(key)
	logger.V(2).Info("Unpublished volume", "targetPath", p.TargetPath)
	return nil
}

// publishStep is one publish step in progress, run under the pod's lock:
// what the actual state held when it began, and how it records a failure.
type publishStep struct {
	o   *Operations
	key volume.PodKey
	id  volume.ID
	// prev is the pod's entry when the step began; known says it had one.
	prev  asw.Pod
	known bool
	// target is what the entry records as target path: from the moment the
	// record may be on disk, the site's, so a teardown finds and removes it.
	target string
	// external marks a step a container orchestrator asked for through the
	// front endpoint.
	external bool
	// migrated marks an in-tree volume translated to CSI.
	migrated bool
	logger   klog.Logger
}

// beginPublish starts a publish step; the pod's lock must be held.
func (o *Operations) beginPublish(ctx context.Context, key volume.PodKey, id volume.ID, external bool) *publishStep {
	s := &publishStep{o: o, key: key, id: id, external: external,
		logger: klog.FromContext(ctx).WithValues("volume", key.Volume, "driver", id.Driver, "podUID", key.Pod)}
	s.prev, s.known = o.state.Pod(key)
	s.target = s.prev.TargetPath
	if v, ok := o.state.Volume(key.Volume); ok && s.id.PVName == "" {
		// A caller's request does not know the PV; keep what was recorded.
		s.id.PVName = v.PVName
	}
	return s
}

// fail records an error of a step that did not reach the driver: the
// publish state stays as it was. A caller's step on a target nobody knew
// records nothing; the caller gets the error.
func (s *publishStep) fail(err error) error {
	s.logger.V(2).Info("Publish failed before NodePublishVolume", "err", err)
	if s.external && !s.known {
		return err
	}
	s.o.state.RecordPublish(s.key, s.id, asw.PublishOutcome{Step: volume.StepPublish, State: s.prev.State,
		TargetPath: s.target, External: s.external, Migrated: s.migrated, Err: err})
	return err
}

// repairTarget tears down the pod's target before it is published again
// when the target is a dead mount (IsDeadMount) of a publish that was recorded (present
// or uncertain), or when the mount check marked the publish uncertain with
// ErrMountBroken (the target missing, or no longer a mount point) and it is
// still not a healthy mount: NodeUnpublishVolume, see brokenmount.go. The
// publish stays uncertain meanwhile; an error is recorded as uncertain and
// returned, and NodePublishVolume is not called.
func (s *publishStep) repairTarget(ctx context.Context, client DriverClient, handle, target string) error {
	if !s.known || s.prev.State == volume.NotPublished {
		return nil
	}
	var why error
	switch broken := s.o.statDead(target); {
	case broken != nil:
		why = broken
	case s.prev.State == volume.PublishUncertain && s.prev.LastError != nil && s.prev.LastError.Step == volume.StepPublish &&
		errors.Is(s.prev.LastError.Err, ErrMountBroken) && !s.o.healthyMount(target):
		// Marked by the mount check (a repair of the staging path records
		// its unpublish, done, under StepUnpublish).
		why = s.prev.LastError.Err
	default:
		return nil
	}
	s.logger.Info("Target is a broken mount; unpublishing it before publishing again", "targetPath", target, "err", why)
	err := s.o.unpublishBroken(ctx, client, handle, target)
	if err != nil {
		s.o.state.RecordPublish(s.key, s.id, asw.PublishOutcome{Step: volume.StepUnpublish, State: volume.PublishUncertain,
			TargetPath: s.target, External: s.external, Migrated: s.migrated, Err: err})
		s.logger.V(2).Info("Unpublishing a broken mount failed", "err", err)
		return err
	}
	// Nothing is published any more, though the state stays uncertain
	// until the publish: a failure of the publish then leaves it uncertain
	// (or NotPublished after a final error, with the record removed).
	s.prev.State = volume.PublishUncertain
	return nil
}

// publishPlan is a publish step ready to run.
type publishPlan struct {
	client DriverClient
	// site is where the volume is published and its record kept.
	site publishingSite
	// record is written to site.Record before the call.
	record checkpoint.PublishRecord
	// req is sent to the driver.
	req *csi.NodePublishVolumeRequest
	// after, if set, runs once NodePublishVolume succeeded: the block map,
	// or the fsGroup ownership change. Its error leaves the publish
	// uncertain.
	after func() error
	// afterStep is the step after's errors are recorded under.
	afterStep volume.Step
	// presentation is how the published volume is handed to the pod,
	// recorded once the publish (and after) succeeded.
	presentation volume.Presentation
}

// run writes the publish record (and, for the layout, the target's parent
// directory), calls NodePublishVolume and records the outcome as
// transitions.go says, cleaning up when nothing ended up published.
func (s *publishStep) run(ctx context.Context, p publishPlan) error {
	o := s.o
	s.target = p.site.Target
	err := o.tree.write(func() error {
		if err := checkpoint.WritePublish(p.site.Record, p.record); err != nil {
			return fmt.Errorf("writing the publish record: %w", err)
		}
		if p.site.caller {
			return nil
		}
		return os.MkdirAll(filepath.Dir(p.site.Target), checkpoint.DirMode)
	})
	if err != nil {
		return s.fail(err)
	}

	rpcErr := p.client.NodePublishVolume(ctx, p.req)
	step := volume.StepPublish
	if rpcErr == nil && p.after != nil {
		// The volume is mounted: an error from here on is uncertain (the
		// kubelet's UncertainProgressError), so the mount is torn down when
		// the pod goes and the step is retried while it stays.
		if err := p.after(); err != nil {
			rpcErr, step = err, p.afterStep
		}
	}
	var presentation *volume.Presentation
	if rpcErr == nil {
		presentation = &p.presentation
	}
	next := afterPublish(s.prev.State, s.prev.Reconstructed, rpcErr)
	if next == volume.NotPublished {
		if cleanErr := o.removePublishing(p.site); cleanErr != nil {
			s.logger.Error(cleanErr, "Failed to clean up after a final NodePublishVolume error")
		}
	}
	if next == volume.NotPublished && s.external && !s.known {
		// The caller got the error; there is nothing to remember.
		o.forgetPod(s.key)
	} else {
		o.state.RecordPublish(s.key, s.id, asw.PublishOutcome{Step: step, State: next, TargetPath: p.site.Target,
			External: s.external, Presentation: presentation, Migrated: s.migrated, Err: rpcErr})
	}
	if rpcErr != nil {
		s.logger.V(2).Info("Publish failed", "step", step, "state", next, "err", rpcErr)
		return rpcErr
	}
	s.logger.V(2).Info("Published volume", "targetPath", p.site.Target)
	return nil
}

// mountsInPublish says whether driver's NodePublishVolume of a persistent
// volume is where the volume itself is mounted: a driver without
// STAGE_UNSTAGE_VOLUME, such as most FUSE drivers (JuiceFS's in process
// mode mounts the file system at a path of its own in NodePublishVolume and
// binds it to the target). Such a driver relies on what the kubelet does —
// one mount step of a volume at a time, across its pods (its MountVolume
// operation key is the volume alone), as the CSI spec asks of a CO — and
// races with itself otherwise: two mounts stacked at its path, one left
// behind at the teardown. Their publishes and unpublishes then hold the
// volume's lock exclusively. Once a volume is staged, a publish is a bind
// mount of the staged volume and those of different pods run in parallel.
// When the driver cannot be asked, the answer is yes: one at a time is
// never wrong, only slower.
func (o *Operations) mountsInPublish(ctx context.Context, driver string, inline bool) bool {
	if inline {
		return false // an inline volume is one pod's: its name holds the pod
	}
	client, err := o.driver(driver)
	if err != nil {
		return true
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		return true
	}
	return !caps.StageUnstage()
}
