package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
)

// NodeStageVolume bind-mounts a filesystem volume's directory at the staging path, or attaches a
// block volume's loop device and bind-mounts it onto <staging path>/device.
func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if !s.d.cfg.Capabilities.StageUnstage {
		return nil, status.Error(codes.Unimplemented, "the STAGE_UNSTAGE_VOLUME capability is off")
	}
	id, path, c := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path missing in request")
	}
	if err := s.d.checkCapability(c); err != nil {
		return nil, err
	}
	if err := checkMountGroup(c); err != nil {
		return nil, err
	}
	if k := s.d.faults.missingSecret(ctx, req.GetSecrets()); k != "" {
		return nil, status.Errorf(codes.InvalidArgument, "secret key %q missing in the node stage secrets", k)
	}
	if s.d.bug(ctx, BugStageInProgressOK) {
		if _, running := s.d.staging.LoadOrStore(id, true); running {
			klog.FromContext(ctx).Info("Bug stage-in-progress-ok: answering OK while the first stage runs", "volume", id)
			return &csi.NodeStageVolumeResponse{}, nil
		}
		defer s.d.staging.Delete(id)
		if !bugPause(ctx, bugSlowFirstStage) {
			return nil, status.Error(codes.Canceled, "bug stage-in-progress-ok: cancelled")
		}
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, ok := s.d.store.get(id)
	if !ok {
		return nil, notFound(id)
	}
	if err := checkAccessType(&v, c); err != nil {
		return nil, err
	}
	if err := s.d.checkPublishContext(&v, req.GetPublishContext()); err != nil {
		return nil, err
	}
	want := Staging{
		Path:       path,
		AccessMode: c.GetAccessMode().GetMode().String(),
		MountFlags: c.GetMount().GetMountFlags(),
		MountGroup: c.GetMount().GetVolumeMountGroup(),
	}
	if st := v.Staged; st != nil {
		if st.Path != path {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", id, st.Path)
		}
		if st.AccessMode != want.AccessMode || !slices.Equal(st.MountFlags, want.MountFlags) || st.MountGroup != want.MountGroup {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %s with a different capability", id, path)
		}
	}

	logger := klog.FromContext(ctx).WithValues("volume", id, "stagingTargetPath", path)
	if err := s.stage(ctx, logger, &v, want); err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, ioStatus(err)
	}
	if v.Staged == nil {
		if _, err := s.d.store.update(id, func(v *Volume) error { v.Staged = &want; return nil }); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	logger.V(2).Info("Staged volume")
	return &csi.NodeStageVolumeResponse{}, nil
}

func (s *nodeServer) stage(ctx context.Context, logger klog.Logger, v *Volume, st Staging) error {
	if v.AccessType == AccessMount {
		if !s.d.bug(ctx, BugIgnoreMountGroup) {
			if err := applyMountGroup(v.Path, st.MountGroup); err != nil {
				return err
			}
		}
		if v.Staged == nil && s.d.bug(ctx, BugFormatOnStage) {
			if err := emptyDir(v.Path); err != nil {
				return err
			}
		}
		if v.Staged == nil && s.d.bug(ctx, BugStageUncheckedMount) {
			var err error
			if isFuse(v) {
				err = s.d.fuse.mount(logger, v, st.Path, false, true)
			} else if err = makeMountPoint(st.Path, false); err == nil {
				err = bindMount(s.d.mounter, v.Path, st.Path, bindOptions(false, st.MountFlags))
			}
			if err != nil {
				return err
			}
			if !bugPause(ctx, bugSlowStage) {
				return status.Error(codes.Canceled, "bug stage-unchecked-mount: cancelled after mounting, before recording")
			}
			return nil
		}
		if isFuse(v) {
			return s.d.fuse.mount(logger, v, st.Path, s.d.bug(ctx, BugKeepBrokenMount), false)
		}
		return ensureBindMount(logger, s.d.mounter, v.Path, st.Path, v.Path, false, bindOptions(false, st.MountFlags))
	}
	dev, err := loopdev.Attach(v.Path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(st.Path, 0o750); err != nil {
		return fmt.Errorf("create staging directory: %w", err)
	}
	return ensureBindMount(logger, s.d.mounter, dev, filepath.Join(st.Path, blockDeviceFile), dev, true, bindOptions(false, nil))
}

// NodeUnstageVolume undoes NodeStageVolume. It fails with FailedPrecondition while the volume is
// still published, and succeeds when the volume is not staged at the path.
func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if !s.d.cfg.Capabilities.StageUnstage {
		return nil, status.Error(codes.Unimplemented, "the STAGE_UNSTAGE_VOLUME capability is off")
	}
	id, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path missing in request")
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, ok := s.d.store.get(id)
	if !ok {
		return nil, notFound(id)
	}
	recorded := v.Staged != nil && v.Staged.Path == path
	if recorded && len(v.Published) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %d target paths", id, len(v.Published))
	}
	logger := klog.FromContext(ctx).WithValues("volume", id, "stagingTargetPath", path)
	if recorded && s.d.bug(ctx, BugUnmountedTeardownFails) {
		mountPoint := path
		if v.AccessType == AccessBlock {
			mountPoint = filepath.Join(path, blockDeviceFile)
		}
		if err := failUnmounted(s.d.mounter, mountPoint); err != nil {
			return nil, err
		}
	}
	if keptBroken(ctx, s.d, logger, &v, path) {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	source, err := s.d.volumeSource(&v)
	if err != nil {
		return nil, ioStatus(err)
	}
	// Unmount even without a record: the plugin may have died between mounting and recording.
	if err := s.unstage(logger, &v, path, source, recorded || v.Staged == nil); err != nil {
		return nil, ioStatus(err)
	}
	if recorded {
		if _, err := s.d.store.update(id, func(v *Volume) error { v.Staged = nil; return nil }); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	logger.V(2).Info("Unstaged volume", "wasStaged", recorded)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// unstage removes what stage made at path. owned says the volume is staged at path or nowhere,
// so that its device file and loop device may go.
func (s *nodeServer) unstage(logger klog.Logger, v *Volume, path, source string, owned bool) error {
	if isFuse(v) {
		return unmountFuse(logger, path, v.ID)
	}
	if v.AccessType == AccessMount {
		return unmountAll(logger, s.d.mounter, path, source)
	}
	devFile := filepath.Join(path, blockDeviceFile)
	if err := unmountAll(logger, s.d.mounter, devFile, source); err != nil {
		return err
	}
	if !owned {
		return nil
	}
	if err := removeMountPoint(s.d.mounter, devFile); err != nil {
		return err
	}
	if len(v.Published) > 0 {
		return nil
	}
	return loopdev.Detach(v.Path)
}
