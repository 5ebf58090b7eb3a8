package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
)

// nodeServer answers the CSI Node service with real bind mounts and loop devices.
//
// Every step first makes the mounts right and then records them, and every check of "is it already
// done" looks at the mount table, not only at the record. So a plugin killed between the two
// finds the work done when the call is retried, as the CSI spec's idempotency rules require.
type nodeServer struct {
	csi.UnimplementedNodeServer
	d *driver
}

var _ csi.NodeServer = &nodeServer{}

// NodePublishVolume bind-mounts the volume at the target path: from the staging path when staging is
// on, else from the volume's directory or loop device. A block volume's target is a file.
func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target, c := req.GetVolumeId(), req.GetTargetPath(), req.GetVolumeCapability()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path missing in request")
	}
	if err := s.d.checkCapability(c); err != nil {
		return nil, err
	}
	if err := checkMountGroup(c); err != nil {
		return nil, err
	}
	if k := s.d.faults.missingSecret(ctx, req.GetSecrets()); k != "" {
		return nil, status.Errorf(codes.InvalidArgument, "secret key %q missing in the node publish secrets", k)
	}
	ephemeral := isEphemeral(req.GetVolumeContext())
	staging := ""
	if s.d.cfg.Capabilities.StageUnstage && !ephemeral {
		if staging = req.GetStagingTargetPath(); staging == "" {
			return nil, status.Error(codes.InvalidArgument, "staging target path missing in request")
		}
	}
	if s.d.bug(ctx, BugFailConcurrentPublish) {
		if _, running := s.d.publishing.LoadOrStore(id, true); running {
			return nil, status.Errorf(codes.Internal, "bug fail-concurrent-publish: a publish of volume %s is in progress", id)
		}
		defer s.d.publishing.Delete(id)
		time.Sleep(bugSlowPublish)
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, ok := s.d.store.get(id)
	if ephemeral {
		var err error
		if v, err = s.d.ensureEphemeral(klog.FromContext(ctx), id); err != nil {
			return nil, err
		}
	} else if !ok {
		return nil, notFound(id)
	}
	if err := checkAccessType(&v, c); err != nil {
		return nil, err
	}
	if !v.Ephemeral {
		if err := s.d.checkPublishContext(&v, req.GetPublishContext()); err != nil {
			return nil, err
		}
	}
	if staging != "" && (v.Staged == nil || v.Staged.Path != staging) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", id, staging)
	}
	if isFuse(&v) && staging == "" {
		return nil, status.Errorf(codes.InvalidArgument, "FUSE volume %s needs the STAGE_UNSTAGE_VOLUME capability", id)
	}
	want := Publication{
		StagingPath: staging,
		ReadOnly:    req.GetReadonly(),
		AccessMode:  c.GetAccessMode().GetMode().String(),
		MountFlags:  c.GetMount().GetMountFlags(),
		MountGroup:  c.GetMount().GetVolumeMountGroup(),
	}
	if err := checkPublication(&v, target, want); err != nil {
		return nil, err
	}

	logger := klog.FromContext(ctx).WithValues("volume", id, "targetPath", target)
	strict := s.d.faults.isStrict(ctx)
	recordAgain := false
	if strict {
		// As a stock FUSE driver: the target is checked first, and a broken one is an error.
		if _, err := os.Stat(target); isBrokenMount(err) {
			return nil, status.Error(codes.Internal, err.Error())
		}
		// As csi-driver-host-path: a recorded target that is not mounted is mounted and recorded again.
		if _, exists := v.Published[target]; exists {
			mounted, err := s.d.mounter.IsMountPoint(target)
			recordAgain = err != nil || !mounted
		}
	}
	if _, exists := v.Published[target]; exists && s.d.bug(ctx, BugPublishStacksMount) {
		if _, err := os.Stat(target); err == nil && v.AccessType == AccessMount {
			from := v.Path
			if staging != "" {
				from = staging
			}
			if err := bindMount(s.d.mounter, from, target, bindOptions(want.ReadOnly, want.MountFlags)); err != nil {
				return nil, ioStatus(err)
			}
			return &csi.NodePublishVolumeResponse{}, nil
		}
	}
	mounted := want
	mounted.ReadOnly = want.ReadOnly && !s.d.bug(ctx, BugIgnoreReadOnly)
	if v.AccessType == AccessBlock && s.d.bug(ctx, BugBlockPublishWithoutMount) {
		if err := makeMountPoint(target, true); err != nil {
			return nil, ioStatus(err)
		}
	} else if err := s.publish(logger, &v, target, mounted); err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, ioStatus(err)
	}
	if _, exists := v.Published[target]; !exists || recordAgain {
		if _, err := s.d.store.update(id, func(v *Volume) error {
			if v.Published == nil {
				v.Published = map[string]Publication{}
			}
			if p, ok := v.Published[target]; ok {
				p.Extra++
				v.Published[target] = p
				logger.Info("Strict: recorded the target once more", "records", p.Extra+1)
				return nil
			}
			v.Published[target] = want
			return nil
		}); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	logger.V(2).Info("Published volume", "readOnly", want.ReadOnly)
	return &csi.NodePublishVolumeResponse{}, nil
}

// checkPublication applies the idempotency and access-mode rules to a new or repeated publication.
func checkPublication(v *Volume, target string, want Publication) error {
	if p, ok := v.Published[target]; ok {
		if p.StagingPath != want.StagingPath || p.ReadOnly != want.ReadOnly || p.AccessMode != want.AccessMode ||
			!slices.Equal(p.MountFlags, want.MountFlags) || p.MountGroup != want.MountGroup {
			return status.Errorf(codes.AlreadyExists, "volume %s is published at %s with different options", v.ID, target)
		}
		return nil
	}
	singleWriter := csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String()
	for other, p := range v.Published {
		if want.AccessMode == singleWriter || p.AccessMode == singleWriter {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published for a single writer at %s", v.ID, other)
		}
	}
	return nil
}

func (s *nodeServer) publish(logger klog.Logger, v *Volume, target string, p Publication) error {
	opts := bindOptions(p.ReadOnly, p.MountFlags)
	if v.AccessType == AccessMount {
		from := v.Path
		if isFuse(v) {
			if err := checkFuseStaged(p.StagingPath, v.ID); err != nil {
				return status.Errorf(codes.FailedPrecondition, "staging path %s does not show FUSE volume %s: %v", p.StagingPath, v.ID, err)
			}
			return ensureBindMount(logger, s.d.mounter, p.StagingPath, target, p.StagingPath, false, opts)
		}
		if p.StagingPath != "" {
			if ok, err := isMountOf(s.d.mounter, p.StagingPath, v.Path); err != nil {
				return err
			} else if !ok {
				return status.Errorf(codes.FailedPrecondition, "staging path %s does not show volume %s", p.StagingPath, v.ID)
			}
			from = p.StagingPath
		} else if err := applyMountGroup(v.Path, p.MountGroup); err != nil {
			return err
		}
		return ensureBindMount(logger, s.d.mounter, from, target, v.Path, false, opts)
	}

	if p.StagingPath == "" {
		dev, err := loopdev.Attach(v.Path)
		if err != nil {
			return err
		}
		return ensureBindMount(logger, s.d.mounter, dev, target, dev, true, opts)
	}
	dev, err := s.d.volumeSource(v)
	if err != nil {
		return err
	}
	from := filepath.Join(p.StagingPath, blockDeviceFile)
	if ok, err := isMountOf(s.d.mounter, from, dev); err != nil {
		return err
	} else if !ok {
		return status.Errorf(codes.FailedPrecondition, "staging path %s does not show volume %s", p.StagingPath, v.ID)
	}
	return ensureBindMount(logger, s.d.mounter, from, target, dev, true, opts)
}

// NodeUnpublishVolume unmounts the target path and removes it. A target that does not show the
// volume is left alone and the call succeeds.
func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target path missing in request")
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, ok := s.d.store.get(id)
	if !ok {
		return nil, notFound(id)
	}
	logger := klog.FromContext(ctx).WithValues("volume", id, "targetPath", target)
	if _, recorded := v.Published[target]; recorded && s.d.bug(ctx, BugUnmountedTeardownFails) {
		if err := failUnmounted(s.d.mounter, target); err != nil {
			return nil, err
		}
	}
	if s.d.bug(ctx, BugUnpublishTrustsRecord) {
		if _, recorded := v.Published[target]; !recorded {
			logger.Info("Bug unpublish-trusts-record: no record of the target, answering OK")
			return &csi.NodeUnpublishVolumeResponse{}, nil
		}
		if _, err := s.d.store.update(id, func(v *Volume) error { delete(v.Published, target); return nil }); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !bugPause(ctx, bugSlowStage) {
			return nil, status.Error(codes.Canceled, "bug unpublish-trusts-record: cancelled after forgetting the target, before unmounting")
		}
	}
	if keptBroken(ctx, s.d, logger, &v, target) {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	source, err := s.d.volumeSource(&v)
	if err != nil {
		return nil, ioStatus(err)
	}
	unmount := func() error { return unmountAll(logger, s.d.mounter, target, source) }
	if isFuse(&v) {
		unmount = func() error { return unmountFuse(logger, target, v.ID) }
	}
	if err := unmount(); err != nil {
		return nil, ioStatus(err)
	}
	_, recorded := v.Published[target]
	if err := removeMountPoint(s.d.mounter, target); err != nil {
		// What is left at an unrecorded target is not ours: another volume's mount or the CO's own files.
		notOurs := errors.Is(err, errForeignMount) || errors.Is(err, unix.ENOTEMPTY)
		if recorded || !notOurs {
			return nil, ioStatus(err)
		}
	}
	remaining := len(v.Published)
	if recorded && v.Published[target].Extra == 0 {
		remaining--
	}
	if v.AccessType == AccessBlock && v.Staged == nil && remaining == 0 {
		// Without staging, the last unpublish releases the loop device that publish attached.
		if err := loopdev.Detach(v.Path); err != nil {
			return nil, ioStatus(err)
		}
	}
	if v.Ephemeral && remaining == 0 {
		// The last unpublish of an inline volume deletes it.
		if err := s.d.deleteEphemeral(logger, &v); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	} else if recorded {
		if _, err := s.d.store.update(id, func(v *Volume) error {
			if p := v.Published[target]; p.Extra > 0 {
				// Strict: one record of the target removed, others left.
				p.Extra--
				v.Published[target] = p
				return nil
			}
			delete(v.Published, target)
			return nil
		}); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	logger.V(2).Info("Unpublished volume", "wasPublished", recorded)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// checkMountGroup validates volume_mount_group: a numeric group ID.
func checkMountGroup(c *csi.VolumeCapability) error {
	g := c.GetMount().GetVolumeMountGroup()
	if g == "" {
		return nil
	}
	if gid, err := strconv.Atoi(g); err != nil || gid < 0 {
		return status.Errorf(codes.InvalidArgument, "volume_mount_group %q is not a group ID", g)
	}
	return nil
}

// applyMountGroup gives the group ownership of a volume directory, with the setgid bit so that
// new files inherit it, the way a kubelet applies fsGroup.
func applyMountGroup(dir, group string) error {
	if group == "" {
		return nil
	}
	gid, err := strconv.Atoi(group)
	if err != nil {
		return fmt.Errorf("parse volume mount group %q: %w", group, err)
	}
	if err := os.Chown(dir, -1, gid); err != nil {
		return fmt.Errorf("chown volume directory: %w", err)
	}
	if err := os.Chmod(dir, 0o777|os.ModeSetgid); err != nil {
		return fmt.Errorf("chmod volume directory: %w", err)
	}
	return nil
}
