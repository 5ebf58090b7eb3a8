package front

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
)

// podUIDPrefix starts every pseudo pod UID, so the status output tells
// them from real pods' UIDs.
const podUIDPrefix = "front-"

// PodUID is the pseudo pod UID under which a container orchestrator's
// publish of a volume at targetPath is recorded: "front-" followed by the
// first 20 bytes of SHA-256(targetPath), in lowercase hex. A CO's
// NodePublishVolume names no pod, and the target path identifies the
// publish both for NodePublishVolume and NodeUnpublishVolume, so the same
// target always yields the same key (volume, PodUID), across restarts too.
// targetPath is hashed as given; the front endpoint only accepts clean
// absolute paths.
func PodUID(targetPath string) types.UID {
	sum := sha256.Sum256([]byte(targetPath))
	return types.UID(podUIDPrefix + hex.EncodeToString(sum[:20]))
}

// nodeServer runs the Node calls through lifecycle/operations. Each handler
// checks its arguments first and fails with InvalidArgument before any lock
// or I/O; paths a caller chose are used as given, but must be absolute,
// clean and free of NUL bytes.
type nodeServer struct {
	csi.UnimplementedNodeServer
	s *Server
}

var _ csi.NodeServer = &nodeServer{}

// NodeStageVolume stages the volume through the lifecycle.
func (n *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := firstError(
		required("volume_id", req.GetVolumeId()),
		checkPath("staging_target_path", req.GetStagingTargetPath()),
		checkCapability(req.GetVolumeCapability()),
	); err != nil {
		return nil, err
	}
	if err := n.s.cfg.Operations.StageRequest(ctx, n.s.cfg.Driver, req); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume unstages the volume through the lifecycle; a volume not
// staged through the front at that path succeeds without a call.
func (n *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := firstError(
		required("volume_id", req.GetVolumeId()),
		checkPath("staging_target_path", req.GetStagingTargetPath()),
	); err != nil {
		return nil, err
	}
	if err := n.s.cfg.Operations.UnstageRequest(ctx, n.s.cfg.Driver, req); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume publishes the volume through the lifecycle, keyed by
// PodUID(target_path).
func (n *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := firstError(
		required("volume_id", req.GetVolumeId()),
		checkPath("target_path", req.GetTargetPath()),
		optionalPath("staging_target_path", req.GetStagingTargetPath()),
		checkCapability(req.GetVolumeCapability()),
	); err != nil {
		return nil, err
	}
	if err := n.s.cfg.Operations.PublishRequest(ctx, n.s.cfg.Driver, PodUID(req.GetTargetPath()), req); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unpublishes the volume through the lifecycle; a
// target not published through the front succeeds without a call.
func (n *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := firstError(
		required("volume_id", req.GetVolumeId()),
		checkPath("target_path", req.GetTargetPath()),
	); err != nil {
		return nil, err
	}
	if err := n.s.cfg.Operations.UnpublishRequest(ctx, n.s.cfg.Driver, PodUID(req.GetTargetPath()), req); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats returns the backend's stats of a volume this node has
// staged or published at volume_path. volume_path is only looked up, never
// used to reach the file system: a path the node does not know, relative
// ones included, is NotFound, as the CSI spec asks.
func (n *nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := firstError(
		required("volume_id", req.GetVolumeId()),
		lookupPath("volume_path", req.GetVolumePath()),
		optionalPath("staging_target_path", req.GetStagingTargetPath()),
	); err != nil {
		return nil, err
	}
	return n.s.cfg.Operations.VolumeStats(ctx, n.s.cfg.Driver, req)
}

// NodeExpandVolume expands, through the backend, a volume this node has
// staged or published at volume_path (looked up as by NodeGetVolumeStats).
func (n *nodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := firstError(
		required("volume_id", req.GetVolumeId()),
		lookupPath("volume_path", req.GetVolumePath()),
		optionalPath("staging_target_path", req.GetStagingTargetPath()),
	); err != nil {
		return nil, err
	}
	return n.s.cfg.Operations.ExpandVolume(ctx, n.s.cfg.Driver, req)
}

// NodeGetVolumeHealth asks the backend for the health of a volume this
// node has staged or published (at the paths the request names, looked up
// as by NodeGetVolumeStats).
func (n *nodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if err := firstError(
		required("volume_id", req.GetVolumeId()),
		optionalPath("volume_publish_path", req.GetVolumePublishPath()),
		optionalPath("staging_target_path", req.GetStagingTargetPath()),
	); err != nil {
		return nil, err
	}
	return n.s.cfg.Operations.VolumeHealth(ctx, n.s.cfg.Driver, req)
}

// NodeGetCapabilities returns the backend's node capabilities, except
// GET_STORAGE_HEALTH: the front endpoint does not serve
// NodeGetStorageHealth.
func (n *nodeServer) NodeGetCapabilities(ctx context.Context, _ *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	caps, err := n.s.cfg.Operations.NodeCapabilities(ctx, n.s.cfg.Driver)
	if err != nil {
		return nil, err
	}
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range caps.Types() {
		if t == csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH {
			continue
		}
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// NodeGetInfo returns the backend's node ID, volume limit and topology.
func (n *nodeServer) NodeGetInfo(ctx context.Context, _ *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return n.s.cfg.Operations.NodeInfo(ctx, n.s.cfg.Driver)
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// required fails when a required field is empty.
func required(field, value string) error {
	if value == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	return nil
}

// checkPath validates a required path the caller chose and the driver
// mounts at: absolute, clean and without NUL bytes.
func checkPath(field, p string) error {
	if p == "" {
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	return optionalPath(field, p)
}

// optionalPath validates a path field that may be empty.
func optionalPath(field, p string) error {
	switch {
	case p == "":
		return nil
	case strings.ContainsRune(p, 0):
		return status.Errorf(codes.InvalidArgument, "%s %q contains a NUL byte", field, p)
	case !filepath.IsAbs(p):
		return status.Errorf(codes.InvalidArgument, "%s %q is not an absolute path", field, p)
	case filepath.Clean(p) != p:
		return status.Errorf(codes.InvalidArgument, "%s %q is not a clean path (%q)", field, p, filepath.Clean(p))
	}
	return nil
}

// lookupPath validates a required path that is only compared with the
// paths the node knows.
func lookupPath(field, p string) error {
	switch {
	case p == "":
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	case strings.ContainsRune(p, 0):
		return status.Errorf(codes.InvalidArgument, "%s %q contains a NUL byte", field, p)
	}
	return nil
}

// checkCapability requires a volume capability with an access mode and an
// access type (mount or block).
func checkCapability(c *csi.VolumeCapability) error {
	switch {
	case c == nil:
		return status.Error(codes.InvalidArgument, "volume_capability is required")
	case c.GetAccessMode() == nil:
		return status.Error(codes.InvalidArgument, "volume_capability.access_mode is required")
	case c.GetMount() == nil && c.GetBlock() == nil:
		return status.Error(codes.InvalidArgument, "volume_capability needs an access type, mount or block")
	}
	return nil
}
