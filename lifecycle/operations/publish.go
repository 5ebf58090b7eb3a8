package operations

import (
	"context"
	"fmt"
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
// reference §1.4) and records the outcome. src is the volume, pv the pod's
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
// Publishes of different pods of a volume run in parallel; a
// ReadWriteOncePod volume's publishes run one at a time (see locks).
//
// Not done (yet): the kubelet's recursive fsGroup ownership change for
// drivers without VOLUME_MOUNT_GROUP, and SELinux mount contexts.
func (o *Operations) Publish(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) (err error) {
	rwop := isReadWriteOncePod(src.AccessModes)
	unlock, err := o.locks.lockPod(ctx, key, rwop)
	if err != nil {
		return err
	}
	defer unlock()
	start := time.Now()
	defer func() { o.observe(src.Driver, volume.StepPublish, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", key.Volume, "driver", src.Driver,
		"pod", klog.KRef(pv.Pod.Namespace, pv.Pod.Name), "podUID", key.Pod)

	id := volumeID(src)
	prev, _ := o.state.Pod(key)
	// target is what the entry records as target path: from the moment the
	// record may be on disk, the layout's, so Unpublish finds and removes it.
	target := prev.TargetPath
	fail := func(err error) error {
		o.state.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: prev.State, TargetPath: target, Err: err})
		logger.V(2).Info("Publish failed before NodePublishVolume", "err", err)
		return err
	}

	client, err := o.driver(src.Driver)
	if err != nil {
		return fail(err)
	}
	pol := o.policies.Get(src.Driver)
	mode := storagev1.VolumeLifecyclePersistent
	if src.Inline {
		mode = storagev1.VolumeLifecycleEphemeral
	}
	if !pol.SupportsLifecycleMode(mode) {
		return fail(fmt.Errorf("%w: driver %q does not support %s volumes (CSIDriver volumeLifecycleModes %v)",
			volume.ErrInvalidSpec, src.Driver, mode, pol.VolumeLifecycleModes))
	}
	pub, err := o.layout.Publishing(key.Pod, pv.PublishName(src), src.AccessType)
	if err != nil {
		return fail(err)
	}
	caps, err := client.NodeCapabilities(ctx)
	if err != nil {
		return fail(fmt.Errorf("getting the node capabilities of driver %q: %w", src.Driver, err))
	}
	stagingPath := ""
	if !src.Inline && caps.StageUnstage() {
		v, ok := o.state.Volume(key.Volume)
		if !ok || v.Stage != volume.Staged {
			return fail(fmt.Errorf("%w: %s", volume.ErrNotStaged, key.Volume))
		}
		stagingPath = v.StagingPath
	}
	publishContext, err := o.publishContext(key.Volume, src, pol.AttachRequired)
	if err != nil {
		return fail(err)
	}
	if rwop {
		for _, uid := range o.state.Publishers(key.Volume) {
			if uid != key.Pod {
				return fail(fmt.Errorf("%w: %s uses the ReadWriteOncePod access mode and is already published for pod %s",
					volume.ErrInUse, key.Volume, uid))
			}
		}
	}
	secrets, err := o.secret(ctx, src.PublishSecret)
	if err != nil {
		return fail(err)
	}
	volCtx, secrets, err := o.publishContexts(ctx, src, pv, pol, secrets)
	if err != nil {
		return fail(err)
	}
	target = pub.Target
	err = o.tree.write(func() error {
		if err := checkpoint.WritePublish(pub.Record, checkpoint.PublishRecord{
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
		}); err != nil {
			return fmt.Errorf("writing the publish record: %w", err)
		}
		return checkpoint.MkdirAll(filepath.Dir(pub.Target))
	})
	if err != nil {
		return fail(err)
	}

	rpcErr := client.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId:          src.Handle,
		PublishContext:    publishContext,
		StagingTargetPath: stagingPath,
		TargetPath:        pub.Target,
		VolumeCapability:  capability(src, caps, pv.FSGroup),
		Readonly:          pv.ReadOnly,
		Secrets:           secrets,
		VolumeContext:     volCtx,
	})
	next := afterPublish(prev.State, prev.Reconstructed, rpcErr)
	if next == volume.NotPublished {
		if cleanErr := o.removePublishing(pub); cleanErr != nil {
			logger.Error(cleanErr, "Failed to clean up after a final NodePublishVolume error")
		}
	}
	o.state.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: next, TargetPath: pub.Target, Err: rpcErr})
	if rpcErr != nil {
		logger.V(2).Info("NodePublishVolume failed", "state", next, "err", rpcErr)
		return rpcErr
	}
	logger.V(2).Info("Published volume", "targetPath", pub.Target)
	return nil
}

// Unpublish unpublishes volume key.Volume for pod key.Pod
// (NodeUnpublishVolume(volume_id, target_path), reference §1.5) and, on
// success, removes the target, the publish record and the pod's directories
// that became empty, and forgets the pod's entry. It needs only what the
// actual state holds (filled from the publish record after a restart), no
// Source; the target path is checked against the layout.
//
// A pod entry the actual state does not know has nothing to unpublish. An
// entry left NotPublished by a failed publish gets no call: leftovers are
// removed and the entry is forgotten. NotFound from the driver counts as
// success. Any other error, or a target still mounted afterwards
// (ErrStillMounted), leaves the publish uncertain: the pod's volume is
// published again while wanted and unpublished again when not.
func (o *Operations) Unpublish(ctx context.Context, key volume.PodKey) (err error) {
	unlock, err := o.locks.lockPod(ctx, key, false)
	if err != nil {
		return err
	}
	defer unlock()
	p, ok := o.state.Pod(key)
	if !ok {
		return nil
	}
	v, _ := o.state.Volume(key.Volume)
	start := time.Now()
	defer func() { o.observe(v.Driver, volume.StepUnpublish, start, err) }()
	logger := klog.FromContext(ctx).WithValues("volume", key.Volume, "driver", v.Driver, "podUID", key.Pod)

	fail := func(state volume.PublishState, err error) error {
		o.state.RecordPublish(key, v.VolumeID, asw.PublishOutcome{Step: volume.StepUnpublish, State: state, TargetPath: p.TargetPath, Err: err})
		logger.V(2).Info("Unpublish failed", "state", state, "err", err)
		return err
	}
	if p.TargetPath == "" {
		// A publish that failed before its target was known left nothing.
		o.state.ForgetPod(key)
		return nil
	}
	parsed, err := o.layout.ParseTarget(p.TargetPath)
	if err != nil {
		return fail(p.State, err)
	}
	if p.State != volume.NotPublished {
		handle, driver := v.Handle, v.Driver
		if handle == "" || driver == "" {
			rec, err := checkpoint.ReadPublish(parsed.Record)
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
	if err := o.removePublishing(parsed.Publishing); err != nil {
		return fail(volume.PublishUncertain, err)
	}
	o.state.ForgetPod(key)
	logger.V(2).Info("Unpublished volume", "targetPath", p.TargetPath)
	return nil
}

// removePublishing removes the target (unless still mounted), then the
// publish record and every directory that became empty: up to <root>/pods
// for the record's side, up to <root>/plugins/kubernetes.io/csi for a block
// target's parent.
func (o *Operations) removePublishing(pub paths.Publishing) error {
	if err := o.tree.removeMountPoint(pub.Target); err != nil {
		return err
	}
	if targetDir := filepath.Dir(pub.Target); targetDir != pub.Dir {
		if err := o.tree.prune(targetDir, o.layout.PluginDir()); err != nil {
			return err
		}
	}
	return o.tree.removeRecordDir(pub.Record, pub.Dir, o.layout.PodsDir())
}
