package front

import (
	"context"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// groupControllerServer passes every GroupController call through to the
// backend unchanged, as controllerServer does.
type groupControllerServer struct {
	csi.UnimplementedGroupControllerServer
	s *Server
}

var _ csi.GroupControllerServer = &groupControllerServer{}

// GroupControllerGetCapabilities passes the call through to the backend.
func (g *groupControllerServer) GroupControllerGetCapabilities(ctx context.Context, req *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	b, err := g.s.backend()
	if err != nil {
		return nil, err
	}
	return b.GroupController().GroupControllerGetCapabilities(ctx, req)
}

// CreateVolumeGroupSnapshot passes the call through to the backend.
func (g *groupControllerServer) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	b, err := g.s.backend()
	if err != nil {
		return nil, err
	}
	return b.GroupController().CreateVolumeGroupSnapshot(ctx, req)
}

// DeleteVolumeGroupSnapshot passes the call through to the backend.
func (g *groupControllerServer) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	b, err := g.s.backend()
	if err != nil {
		return nil, err
	}
	return b.GroupController().DeleteVolumeGroupSnapshot(ctx, req)
}

// GetVolumeGroupSnapshot passes the call through to the backend.
func (g *groupControllerServer) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	b, err := g.s.backend()
	if err != nil {
		return nil, err
	}
	return b.GroupController().GetVolumeGroupSnapshot(ctx, req)
}
