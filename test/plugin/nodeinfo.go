package plugin

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
)

// NodeGetInfo reports the node ID, the volume limit and the node's topology.
func (s *nodeServer) NodeGetInfo(ctx context.Context, _ *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.d.cfg.NodeID,
		MaxVolumesPerNode:  s.d.maxVolumes(ctx),
		AccessibleTopology: s.d.nodeTopology(),
	}, nil
}

// NodeGetCapabilities advertises the configured node capabilities.
func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	c := s.d.cfg.Capabilities
	var types []csi.NodeServiceCapability_RPC_Type
	for _, t := range []struct {
		on  bool
		typ csi.NodeServiceCapability_RPC_Type
	}{
		{c.StageUnstage, csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME},
		{c.Expand, csi.NodeServiceCapability_RPC_EXPAND_VOLUME},
		{c.VolumeStats, csi.NodeServiceCapability_RPC_GET_VOLUME_STATS},
		{c.VolumeHealth, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH},
		{c.VolumeMountGroup, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP},
		{c.SingleNodeMultiWriter, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER},
	} {
		if t.on {
			types = append(types, t.typ)
		}
	}
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// volumeAt returns the volume if path is where it is staged or published, else a NotFound error.
func (s *nodeServer) volumeAt(id, path string) (Volume, error) {
	v, ok := s.d.store.get(id)
	if !ok {
		return Volume{}, notFound(id)
	}
	if _, published := v.Published[path]; published || (v.Staged != nil && v.Staged.Path == path) {
		return v, nil
	}
	return Volume{}, status.Errorf(codes.NotFound, "volume %s is neither staged nor published at %s", id, path)
}

// NodeGetVolumeStats reports the bytes used by the files of a filesystem volume against the size of its
// file system, the inodes of the filesystem holding it, or the size of a block volume.
func (s *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if !s.d.cfg.Capabilities.VolumeStats {
		return nil, status.Error(codes.Unimplemented, "the GET_VOLUME_STATS capability is off")
	}
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path missing in request")
	}
	v, err := s.volumeAt(id, path)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume path %s: %v", path, err)
	}
	if v.AccessType == AccessBlock {
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{
			Unit:  csi.VolumeUsage_BYTES,
			Total: v.CapacityBytes,
		}}}, nil
	}
	used, err := usedBytes(path)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if s.d.bug(ctx, BugStatsUsedZero) {
		used = 0
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	total := v.filesystemBytes()
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{
			Unit:      csi.VolumeUsage_BYTES,
			Total:     total,
			Used:      used,
			Available: max(total-used, 0),
		},
		{
			Unit:      csi.VolumeUsage_INODES,
			Total:     int64(sfs.Files),
			Used:      int64(sfs.Files - sfs.Ffree),
			Available: int64(sfs.Ffree),
		},
	}}, nil
}

// NodeGetVolumeHealth reports the adverse health conditions of a volume: those the control file sets
// for it (FaultConfig.VolumeHealth), and INACCESSIBLE "MountBroken" when its publish or staging path
// is a broken mount (its FUSE server died). No condition means healthy.
func (s *nodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if !s.d.cfg.Capabilities.VolumeHealth {
		return nil, status.Error(codes.Unimplemented, "the GET_VOLUME_HEALTH capability is off")
	}
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if _, ok := s.d.store.get(id); !ok {
		return nil, notFound(id)
	}
	health := &csi.VolumeHealth{VolumeId: id}
	if r, ok := s.d.faults.volumeHealth(ctx, id); ok {
		health.HealthStatuses = append(health.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType(csi.VolumeHealthErrorType_value[r.Status]), Reason: r.Reason, Message: r.Message,
		})
	}
	for _, p := range []string{req.GetVolumePublishPath(), req.GetStagingTargetPath()} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); mount.IsCorruptedMnt(err) {
			health.HealthStatuses = append(health.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
				Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "MountBroken", Message: fmt.Sprintf("%s: %v", p, err),
			})
			break
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: health}, nil
}

// usedBytes sums the sizes of the regular files below dir.
func usedBytes(dir string) (int64, error) {
	var used int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			info, err := e.Info()
			if err != nil {
				return err
			}
			used += info.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	return used, nil
}

// NodeExpandVolume grows the volume's file system to the required size (or to the whole volume when
// ControllerExpandVolume made it larger): a block volume's image file and loop device really grow, a
// filesystem volume's size is recorded and reported by NodeGetVolumeStats. It never shrinks a volume.
func (s *nodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if !s.d.cfg.Capabilities.Expand {
		return nil, status.Error(codes.Unimplemented, "the EXPAND_VOLUME capability is off")
	}
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path missing in request")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := s.d.checkCapability(c); err != nil {
			return nil, err
		}
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if limit > 0 && required > limit {
		return nil, status.Errorf(codes.OutOfRange, "required bytes %d exceed limit bytes %d", required, limit)
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, err := s.volumeAt(id, path)
	if err != nil {
		return nil, err
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkAccessType(&v, c); err != nil {
			return nil, err
		}
	}
	if s.d.bug(ctx, BugExpandNoop) {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: required}, nil
	}
	if required <= v.filesystemBytes() {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: v.filesystemBytes()}, nil
	}
	if required < v.CapacityBytes {
		// ControllerExpandVolume grew the volume further than asked: grow the file system to all of it.
		required = v.CapacityBytes
	}
	if v.AccessType == AccessBlock {
		required = (required + blockAlignment - 1) / blockAlignment * blockAlignment
		if err := os.Truncate(v.Path, required); err != nil {
			return nil, status.Errorf(codes.Internal, "grow volume image: %v", err)
		}
		if err := loopdev.RefreshCapacity(v.Path); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if _, err := s.d.store.update(id, func(v *Volume) error { v.CapacityBytes, v.FilesystemBytes = required, 0; return nil }); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	klog.FromContext(ctx).V(2).Info("Expanded volume on the node", "volume", id, "capacityBytes", required)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: required}, nil
}
