package front

import (
	"context"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// controllerServer passes every Controller call through to the backend
// unchanged: the request as it came, the backend's reply or error (code and
// message) as it went. Arguments are the backend's to check.
type controllerServer struct {
	csi.UnimplementedControllerServer
	s *Server
}

var _ csi.ControllerServer = &controllerServer{}

// CreateVolume passes the call through to the backend.
func (c *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().CreateVolume(ctx, req)
}

// DeleteVolume passes the call through to the backend.
func (c *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().DeleteVolume(ctx, req)
}

// ControllerPublishVolume passes the call through to the backend.
func (c *controllerServer) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerPublishVolume(ctx, req)
}

// ControllerUnpublishVolume passes the call through to the backend.
func (c *controllerServer) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerUnpublishVolume(ctx, req)
}

// ValidateVolumeCapabilities passes the call through to the backend.
func (c *controllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ValidateVolumeCapabilities(ctx, req)
}

// ListVolumes passes the call through to the backend.
func (c *controllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ListVolumes(ctx, req)
}

// ControllerListVolumeHealth passes the call through to the backend.
func (c *controllerServer) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerListVolumeHealth(ctx, req)
}

// ControllerGetVolumeHealth passes the call through to the backend.
func (c *controllerServer) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerGetVolumeHealth(ctx, req)
}

// GetCapacity passes the call through to the backend.
func (c *controllerServer) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().GetCapacity(ctx, req)
}

// ControllerGetCapabilities passes the call through to the backend.
func (c *controllerServer) ControllerGetCapabilities(ctx context.Context, req *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerGetCapabilities(ctx, req)
}

// CreateSnapshot passes the call through to the backend.
func (c *controllerServer) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().CreateSnapshot(ctx, req)
}

// DeleteSnapshot passes the call through to the backend.
func (c *controllerServer) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().DeleteSnapshot(ctx, req)
}

// ListSnapshots passes the call through to the backend.
func (c *controllerServer) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ListSnapshots(ctx, req)
}

// GetSnapshot passes the call through to the backend.
func (c *controllerServer) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().GetSnapshot(ctx, req)
}

// ControllerExpandVolume passes the call through to the backend.
func (c *controllerServer) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerExpandVolume(ctx, req)
}

// ControllerGetVolume passes the call through to the backend.
func (c *controllerServer) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerGetVolume(ctx, req)
}

// ControllerModifyVolume passes the call through to the backend.
func (c *controllerServer) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	b, err := c.s.backend()
	if err != nil {
		return nil, err
	}
	return b.Controller().ControllerModifyVolume(ctx, req)
}
