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

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
)

// NodeGetInfo reports the node ID, the volume limit and the node's topology.
func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.d.cfg.NodeID,
		MaxVolumesPerNode:  s.d.cfg.MaxVolumesPerNode,
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

// NodeGetVolumeStats reports the bytes used by the files of a filesystem volume against its capacity,
// the inodes of the filesystem holding it, or the size of a block volume.
func (s *nodeServer) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
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
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{
			Unit:      csi.VolumeUsage_BYTES,
			Total:     v.CapacityBytes,
			Used:      used,
			Available: max(v.CapacityBytes-used, 0),
		},
		{
			Unit:      csi.VolumeUsage_INODES,
			Total:     int64(sfs.Files),
			Used:      int64(sfs.Files - sfs.Ffree),
			Available: int64(sfs.Ffree),
		},
	}}, nil
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

// NodeExpandVolume grows the volume to the required size: a block volume's image file and loop
// device really grow, a filesystem volume's capacity is recorded. It never shrinks a volume.
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
	if required <= v.CapacityBytes {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: v.CapacityBytes}, nil
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
	if _, err := s.d.store.update(id, func(v *Volume) error { v.CapacityBytes = required; return nil }); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	klog.FromContext(ctx).V(2).Info("Expanded volume", "volume", id, "capacityBytes", required)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: required}, nil
}
