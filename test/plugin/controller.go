package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
)

// blockAlignment is the granularity of block volume sizes; loop devices need whole sectors.
const blockAlignment = 4096

// controllerServer answers the CSI Controller service. The node it attaches to is the plugin's own node.
type controllerServer struct {
	csi.UnimplementedControllerServer
	d *driver
}

var _ csi.ControllerServer = &controllerServer{}

// CreateVolume creates a directory (mount) or a sparse image file (block) under the state directory.
func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "name missing in request")
	}
	caps := req.GetVolumeCapabilities()
	if len(caps) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing in request")
	}
	for _, c := range caps {
		if err := s.d.checkCapability(c); err != nil {
			return nil, err
		}
		if accessType(c) != accessType(caps[0]) {
			return nil, status.Error(codes.InvalidArgument, "volume capabilities mix block and mount access types")
		}
		if c.GetBlock() != nil && s.d.faults.filesystemOnly(ctx) {
			return nil, status.Error(codes.InvalidArgument, "block volumes are not supported: a filesystem-only driver")
		}
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume content sources are not supported")
	}
	at := accessType(caps[0])
	size, err := volumeSize(req.GetCapacityRange(), at)
	if err != nil {
		return nil, err
	}
	if len(s.d.cfg.Topology) > 0 && req.GetAccessibilityRequirements() == nil && s.d.faults.requireAccessibility(ctx) {
		return nil, status.Error(codes.Internal, "can not find any node: no accessibility requirements")
	}
	if err := s.checkAccessibility(req.GetAccessibilityRequirements()); err != nil {
		return nil, err
	}

	unlock := s.d.locks.lock("name/" + name)
	defer unlock()
	logger := klog.FromContext(ctx)

	if v, ok := s.d.store.getByName(name); ok {
		limit := req.GetCapacityRange().GetLimitBytes()
		if v.AccessType != at || v.CapacityBytes < req.GetCapacityRange().GetRequiredBytes() ||
			(limit > 0 && v.CapacityBytes > limit) || !maps.Equal(v.Parameters, req.GetParameters()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with incompatible size, access type or parameters", name)
		}
		logger.V(4).Info("Volume exists", "volume", v.ID, "name", name)
		return &csi.CreateVolumeResponse{Volume: s.csiVolume(&v)}, nil
	}

	v := Volume{
		ID:            "vol-" + uuid.NewString(),
		Name:          name,
		CapacityBytes: size,
		AccessType:    at,
		Parameters:    maps.Clone(req.GetParameters()),
	}
	v.Path = filepath.Join(s.d.volumesDir, v.ID)
	if at == AccessBlock {
		v.Path += ".img"
	}
	if err := createBacking(&v, s.d.cfg.VolumeDirMode); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := s.d.store.create(v, s.d.cfg.Capacity); err != nil {
		_ = os.RemoveAll(v.Path)
		if errors.Is(err, errNoCapacity) {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	logger.V(2).Info("Created volume", "volume", v.ID, "name", name, "accessType", at, "capacityBytes", size)
	return &csi.CreateVolumeResponse{Volume: s.csiVolume(&v)}, nil
}

// volumeSize picks the size for a new volume from a capacity range.
func volumeSize(r *csi.CapacityRange, at AccessType) (int64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, status.Error(codes.InvalidArgument, "capacity range has negative bytes")
	}
	if limit > 0 && required > limit {
		return 0, status.Errorf(codes.OutOfRange, "required bytes %d exceed limit bytes %d", required, limit)
	}
	size := required
	if size == 0 {
		size = defaultVolumeSize
		if limit > 0 && size > limit {
			size = limit
		}
	}
	if at == AccessBlock {
		size = (size + blockAlignment - 1) / blockAlignment * blockAlignment
		if limit > 0 && size > limit {
			return 0, status.Errorf(codes.OutOfRange, "block volumes are sized in %d-byte units, none fits in [%d, %d]", blockAlignment, required, limit)
		}
	}
	return size, nil
}

func (s *controllerServer) checkAccessibility(req *csi.TopologyRequirement) error {
	if len(s.d.cfg.Topology) == 0 || len(req.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range req.GetRequisite() {
		if s.d.topologyMatches(t) {
			return nil
		}
	}
	return status.Errorf(codes.ResourceExhausted, "no requisite topology matches the node's topology %v", s.d.cfg.Topology)
}

func createBacking(v *Volume, dirMode os.FileMode) error {
	if v.AccessType == AccessMount {
		if dirMode == 0 {
			dirMode = 0o777 // writable by any pod
		}
		if err := os.Mkdir(v.Path, dirMode); err != nil {
			return fmt.Errorf("create volume directory: %w", err)
		}
		// Mkdir honours the umask.
		if err := os.Chmod(v.Path, dirMode); err != nil {
			return fmt.Errorf("chmod volume directory: %w", err)
		}
		return nil
	}
	f, err := os.OpenFile(v.Path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("create volume image: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(v.CapacityBytes); err != nil {
		return fmt.Errorf("size volume image: %w", err)
	}
	return nil
}

func (s *controllerServer) csiVolume(v *Volume) *csi.Volume {
	out := &csi.Volume{
		VolumeId:      v.ID,
		CapacityBytes: v.CapacityBytes,
		VolumeContext: maps.Clone(v.Parameters),
	}
	if t := s.d.nodeTopology(); t != nil {
		out.AccessibleTopology = []*csi.Topology{t}
	}
	return out
}

// DeleteVolume removes the volume's backing storage and record. Deleting an unknown volume succeeds;
// deleting one that is still attached, staged or published fails with FailedPrecondition.
func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, ok := s.d.store.get(id)
	if !ok {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if len(v.Attachments) > 0 || v.Staged != nil || len(v.Published) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still attached, staged or published", id)
	}
	if v.AccessType == AccessBlock {
		if err := loopdev.Detach(v.Path); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if err := os.RemoveAll(v.Path); err != nil {
		return nil, status.Errorf(codes.Internal, "remove volume storage: %v", err)
	}
	if err := s.d.store.remove(id); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	klog.FromContext(ctx).V(2).Info("Deleted volume", "volume", id)
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerPublishVolume records the attachment of a volume to the plugin's node and returns the
// publish_context the node calls must present.
func (s *controllerServer) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if !s.d.cfg.Capabilities.ControllerPublish {
		return nil, status.Error(codes.Unimplemented, "the PUBLISH_UNPUBLISH_VOLUME capability is off")
	}
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if nodeID == "" {
		return nil, status.Error(codes.InvalidArgument, "node ID missing in request")
	}
	if err := s.d.checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, ok := s.d.store.get(id)
	if !ok {
		return nil, notFound(id)
	}
	if nodeID != s.d.cfg.NodeID {
		return nil, status.Errorf(codes.NotFound, "node %s not found", nodeID)
	}
	if err := checkAccessType(&v, req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	resp := &csi.ControllerPublishVolumeResponse{PublishContext: publishContext(&v)}
	if a, ok := v.Attachments[nodeID]; ok {
		if a.ReadOnly != req.GetReadonly() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is attached to node %s with readonly=%t", id, nodeID, a.ReadOnly)
		}
		return resp, nil
	}

	// Serialize attachments to this node so that the volume limit holds under concurrency.
	unlockNode := s.d.locks.lock("node/" + nodeID)
	defer unlockNode()
	if limit := s.d.maxVolumes(ctx); limit > 0 && s.d.store.attachedTo(nodeID) >= limit {
		return nil, status.Errorf(codes.ResourceExhausted, "node %s already has %d volumes attached", nodeID, limit)
	}
	if _, err := s.d.store.update(id, func(v *Volume) error {
		if v.Attachments == nil {
			v.Attachments = map[string]Attachment{}
		}
		v.Attachments[nodeID] = Attachment{ReadOnly: req.GetReadonly()}
		return nil
	}); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	klog.FromContext(ctx).V(2).Info("Attached volume", "volume", id, "node", nodeID)
	return resp, nil
}

// ControllerUnpublishVolume removes the attachment. Unknown volumes and nodes succeed; a volume still
// staged or published on the plugin's node fails with FailedPrecondition.
func (s *controllerServer) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if !s.d.cfg.Capabilities.ControllerPublish {
		return nil, status.Error(codes.Unimplemented, "the PUBLISH_UNPUBLISH_VOLUME capability is off")
	}
	id, nodeID := req.GetVolumeId(), req.GetNodeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	found, err := s.d.store.update(id, func(v *Volume) error {
		if (nodeID == "" || nodeID == s.d.cfg.NodeID) && (v.Staged != nil || len(v.Published) > 0) {
			return status.Errorf(codes.FailedPrecondition, "volume %s is still staged or published on node %s", id, s.d.cfg.NodeID)
		}
		if nodeID == "" {
			v.Attachments = nil
		} else {
			delete(v.Attachments, nodeID)
		}
		return nil
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	if found {
		klog.FromContext(ctx).V(2).Info("Detached volume", "volume", id, "node", nodeID)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities the volume supports.
func (s *controllerServer) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities missing in request")
	}
	v, ok := s.d.store.get(id)
	if !ok {
		return nil, notFound(id)
	}
	for _, c := range req.GetVolumeCapabilities() {
		err := s.d.checkCapability(c)
		if err == nil {
			err = checkAccessType(&v, c)
		}
		if err != nil {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes pages through the volumes in ID order; the token is the index of the next entry.
func (s *controllerServer) ListVolumes(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries is negative")
	}
	vols := s.d.store.list()
	start := 0
	if tok := req.GetStartingToken(); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(vols) {
			return nil, status.Errorf(codes.Aborted, "invalid starting token %q", tok)
		}
		start = n
	}
	end, next := len(vols), ""
	if m := int(req.GetMaxEntries()); m > 0 && start+m < len(vols) {
		end, next = start+m, strconv.Itoa(start+m)
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for i := start; i < end; i++ {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: s.csiVolume(&vols[i])})
	}
	return resp, nil
}

// GetCapacity reports the capacity not yet taken by volumes, or 0 for a topology the node is not in.
func (s *controllerServer) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if len(s.d.cfg.Topology) > 0 && req.GetAccessibleTopology() != nil && !s.d.topologyMatches(req.GetAccessibleTopology()) {
		return &csi.GetCapacityResponse{}, nil
	}
	for _, c := range req.GetVolumeCapabilities() {
		if s.d.checkCapability(c) != nil {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	available := max(s.d.cfg.Capacity-s.d.store.usedCapacity(), 0)
	return &csi.GetCapacityResponse{AvailableCapacity: available}, nil
}

// ControllerGetCapabilities advertises the always-on capabilities plus the configured ones.
func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	types := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	}
	if s.d.cfg.Capabilities.ControllerPublish {
		types = append(types, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME, csi.ControllerServiceCapability_RPC_PUBLISH_READONLY)
	}
	if s.d.cfg.Capabilities.SingleNodeMultiWriter {
		types = append(types, csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	}
	if s.d.cfg.Capabilities.Expand {
		types = append(types, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME)
	}
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// ControllerExpandVolume grows a volume, as the external-resizer asks for it: a block volume's image
// file (and loop device) grow at once, a filesystem volume's capacity is recorded while its file
// system keeps its size until NodeExpandVolume. Both answer node_expansion_required, so the resizer
// leaves the claim NodeResizePending for the node. It never shrinks a volume.
func (s *controllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if !s.d.cfg.Capabilities.Expand {
		return nil, status.Error(codes.Unimplemented, "the EXPAND_VOLUME capability is off")
	}
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing in request")
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if required <= 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity range required bytes missing in request")
	}
	if limit > 0 && required > limit {
		return nil, status.Errorf(codes.OutOfRange, "required bytes %d exceed limit bytes %d", required, limit)
	}
	unlock := s.d.locks.lock(id)
	defer unlock()

	v, ok := s.d.store.get(id)
	if !ok {
		return nil, notFound(id)
	}
	if required <= v.CapacityBytes {
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: v.filesystemBytes() < v.CapacityBytes}, nil
	}
	if v.AccessType == AccessBlock {
		required = (required + blockAlignment - 1) / blockAlignment * blockAlignment
		if err := os.Truncate(v.Path, required); err != nil {
			return nil, status.Errorf(codes.Internal, "grow volume image: %v", err)
		}
	}
	if _, err := s.d.store.update(id, func(v *Volume) error {
		if v.AccessType == AccessMount && v.FilesystemBytes == 0 {
			v.FilesystemBytes = v.CapacityBytes
		}
		v.CapacityBytes = required
		return nil
	}); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	klog.FromContext(ctx).V(2).Info("Expanded volume on the controller", "volume", id, "capacityBytes", required)
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: required, NodeExpansionRequired: true}, nil
}
