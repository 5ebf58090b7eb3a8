package csiclient

import (
	"context"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ControllerCapabilities is the set of controller service RPC capabilities
// a driver advertised in ControllerGetCapabilities. The zero value
// advertises nothing. It is immutable and safe to share.
type ControllerCapabilities struct {
	rpcs map[csi.ControllerServiceCapability_RPC_Type]struct{}
}

// NewControllerCapabilities returns a set holding types.
func NewControllerCapabilities(types ...csi.ControllerServiceCapability_RPC_Type) ControllerCapabilities {
	rpcs := make(map[csi.ControllerServiceCapability_RPC_Type]struct{}, len(types))
	for _, t := range types {
		rpcs[t] = struct{}{}
	}
	return ControllerCapabilities{rpcs: rpcs}
}

// Has reports whether the driver advertised t.
func (c ControllerCapabilities) Has(t csi.ControllerServiceCapability_RPC_Type) bool {
	_, ok := c.rpcs[t]
	return ok
}

// PublishUnpublish reports PUBLISH_UNPUBLISH_VOLUME: the driver attaches
// volumes to nodes with ControllerPublishVolume.
func (c ControllerCapabilities) PublishUnpublish() bool {
	return c.Has(csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME)
}

// SingleNodeMultiWriter reports SINGLE_NODE_MULTI_WRITER: the driver
// understands the SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER
// access modes.
func (c ControllerCapabilities) SingleNodeMultiWriter() bool {
	return c.Has(csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
}

// ControllerCapabilities calls Controller.ControllerGetCapabilities. A
// driver without a Controller service (Unimplemented) has no controller
// capabilities: that is an answer, not an error. The answer is not cached;
// it is asked for once per attach.
func (c *Client) ControllerCapabilities(ctx context.Context) (ControllerCapabilities, error) {
	resp, err := c.controller.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if status.Code(err) == codes.Unimplemented {
		return ControllerCapabilities{}, nil
	}
	if err != nil {
		return ControllerCapabilities{}, Classify(c.driver, methodControllerGetCapabilities, err)
	}
	var types []csi.ControllerServiceCapability_RPC_Type
	for _, cap := range resp.GetCapabilities() {
		if rpc := cap.GetRpc(); rpc != nil {
			types = append(types, rpc.GetType())
		}
	}
	return NewControllerCapabilities(types...), nil
}

// ControllerPublishVolume calls Controller.ControllerPublishVolume. req must
// carry volume_id, node_id and volume_capability.
func (c *Client) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if err := ValidateRequest(req); err != nil {
		return nil, Classify(c.driver, methodControllerPublishVolume, err)
	}
	resp, err := c.controller.ControllerPublishVolume(ctx, req)
	if err != nil {
		return nil, Classify(c.driver, methodControllerPublishVolume, err)
	}
	return resp, nil
}

// ControllerUnpublishVolume calls Controller.ControllerUnpublishVolume. req
// must carry volume_id. NotFound from the driver (the volume or the node is
// gone) yields ErrAlreadyDone.
func (c *Client) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) error {
	if err := ValidateRequest(req); err != nil {
		return Classify(c.driver, methodControllerUnpublishVolume, err)
	}
	_, err := c.controller.ControllerUnpublishVolume(ctx, req)
	return Classify(c.driver, methodControllerUnpublishVolume, err)
}
