package csiclient

import (
	"context"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// Short CSI method names, used in RPCError.Method and by Classify.
const (
	methodGetPluginInfo         = "GetPluginInfo"
	methodGetPluginCapabilities = "GetPluginCapabilities"
	methodProbe                 = "Probe"
	methodNodeGetInfo           = "NodeGetInfo"
	methodNodeGetCapabilities   = "NodeGetCapabilities"
	methodNodeStageVolume       = "NodeStageVolume"
	methodNodeUnstageVolume     = "NodeUnstageVolume"
	methodNodePublishVolume     = "NodePublishVolume"
	methodNodeUnpublishVolume   = "NodeUnpublishVolume"
	methodNodeGetVolumeStats    = "NodeGetVolumeStats"
	methodNodeExpandVolume      = "NodeExpandVolume"

	methodControllerGetCapabilities = "ControllerGetCapabilities"
	methodControllerPublishVolume   = "ControllerPublishVolume"
	methodControllerUnpublishVolume = "ControllerUnpublishVolume"
)

// Every typed call below returns nil or an *RPCError (see Classify).

// GetPluginInfo calls Identity.GetPluginInfo.
func (c *Client) GetPluginInfo(ctx context.Context) (*csi.GetPluginInfoResponse, error) {
	resp, err := c.identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return nil, Classify(c.driver, methodGetPluginInfo, err)
	}
	return resp, nil
}

// GetPluginCapabilities calls Identity.GetPluginCapabilities.
func (c *Client) GetPluginCapabilities(ctx context.Context) (*csi.GetPluginCapabilitiesResponse, error) {
	resp, err := c.identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		return nil, Classify(c.driver, methodGetPluginCapabilities, err)
	}
	return resp, nil
}

// Probe calls Identity.Probe once. A reply without "ready" means ready.
func (c *Client) Probe(ctx context.Context) (*csi.ProbeResponse, error) {
	resp, err := c.identity.Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		return nil, Classify(c.driver, methodProbe, err)
	}
	return resp, nil
}

// NodeGetInfo calls Node.NodeGetInfo.
func (c *Client) NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error) {
	resp, err := c.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return nil, Classify(c.driver, methodNodeGetInfo, err)
	}
	return resp, nil
}

// NodeCapabilities returns the driver's node capabilities. The first call
// asks the driver (NodeGetCapabilities); later calls are answered from a
// cache that lasts as long as the connection: it is dropped when the
// connection is lost and by InvalidateCapabilities. A failed call caches
// nothing.
func (c *Client) NodeCapabilities(ctx context.Context) (NodeCapabilities, error) {
	c.capMu.Lock()
	// The connected check covers the moment between the driver going away
	// and watchConnection noticing it.
	if c.caps != nil && c.connected() {
		caps := *c.caps
		c.capMu.Unlock()
		return caps, nil
	}
	gen := c.capGen
	c.capMu.Unlock()

	resp, err := c.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		return NodeCapabilities{}, Classify(c.driver, methodNodeGetCapabilities, err)
	}
	caps := nodeCapabilitiesFrom(resp)

	c.capMu.Lock()
	defer c.capMu.Unlock()
	if c.capGen == gen {
		c.caps = &caps
	}
	return caps, nil
}

// InvalidateCapabilities drops the cached node capabilities, so the next
// NodeCapabilities call asks the driver again. Call it when the driver
// re-registers.
func (c *Client) InvalidateCapabilities() {
	c.capMu.Lock()
	defer c.capMu.Unlock()
	c.caps = nil
	c.capGen++
}

// NodeStageVolume calls Node.NodeStageVolume. req must carry volume_id,
// staging_target_path and volume_capability.
func (c *Client) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) error {
	if err := ValidateRequest(req); err != nil {
		return Classify(c.driver, methodNodeStageVolume, err)
	}
	_, err := c.node.NodeStageVolume(ctx, req)
	return Classify(c.driver, methodNodeStageVolume, err)
}

// NodeUnstageVolume calls Node.NodeUnstageVolume. req must carry volume_id
// and staging_target_path. NotFound from the driver yields ErrAlreadyDone.
func (c *Client) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) error {
	if err := ValidateRequest(req); err != nil {
		return Classify(c.driver, methodNodeUnstageVolume, err)
	}
	_, err := c.node.NodeUnstageVolume(ctx, req)
	return Classify(c.driver, methodNodeUnstageVolume, err)
}

// NodePublishVolume calls Node.NodePublishVolume. req must carry volume_id,
// target_path and volume_capability.
func (c *Client) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) error {
	if err := ValidateRequest(req); err != nil {
		return Classify(c.driver, methodNodePublishVolume, err)
	}
	_, err := c.node.NodePublishVolume(ctx, req)
	return Classify(c.driver, methodNodePublishVolume, err)
}

// NodeUnpublishVolume calls Node.NodeUnpublishVolume. req must carry
// volume_id and target_path. NotFound from the driver yields ErrAlreadyDone.
func (c *Client) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) error {
	if err := ValidateRequest(req); err != nil {
		return Classify(c.driver, methodNodeUnpublishVolume, err)
	}
	_, err := c.node.NodeUnpublishVolume(ctx, req)
	return Classify(c.driver, methodNodeUnpublishVolume, err)
}

// NodeGetVolumeStats calls Node.NodeGetVolumeStats. req must carry
// volume_id and volume_path. Whether the driver has GET_VOLUME_STATS is the
// caller's to check (NodeCapabilities().Stats()).
func (c *Client) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := ValidateRequest(req); err != nil {
		return nil, Classify(c.driver, methodNodeGetVolumeStats, err)
	}
	resp, err := c.node.NodeGetVolumeStats(ctx, req)
	if err != nil {
		return nil, Classify(c.driver, methodNodeGetVolumeStats, err)
	}
	return resp, nil
}

// NodeExpandVolume calls Node.NodeExpandVolume. req must carry volume_id
// and volume_path. Whether the driver has EXPAND_VOLUME is the caller's to
// check (NodeCapabilities().Expand()).
func (c *Client) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := ValidateRequest(req); err != nil {
		return nil, Classify(c.driver, methodNodeExpandVolume, err)
	}
	resp, err := c.node.NodeExpandVolume(ctx, req)
	if err != nil {
		return nil, Classify(c.driver, methodNodeExpandVolume, err)
	}
	return resp, nil
}
