package csiclient

import (
	"context"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// methodNodeGetVolumeHealth is NodeGetVolumeHealth's short name.
const methodNodeGetVolumeHealth = "NodeGetVolumeHealth"

// VolumeHealth reports GET_VOLUME_HEALTH: the driver implements
// NodeGetVolumeHealth (CSI 1.13; it replaced the alpha VOLUME_CONDITION of
// NodeGetVolumeStats).
func (c NodeCapabilities) VolumeHealth() bool {
	return c.Has(csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH)
}

// NodeGetVolumeHealth calls Node.NodeGetVolumeHealth. req must carry
// volume_id. Whether the driver has GET_VOLUME_HEALTH is the caller's to
// check (NodeCapabilities().VolumeHealth()).
func (c *Client) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, Classify(c.driver, methodNodeGetVolumeHealth, status.Error(codes.InvalidArgument, "csiclient: *csi.NodeGetVolumeHealthRequest: volume_id is required"))
	}
	resp, err := c.node.NodeGetVolumeHealth(ctx, req)
	if err != nil {
		return nil, Classify(c.driver, methodNodeGetVolumeHealth, err)
	}
	return resp, nil
}
