package csiclienttest

import (
	"context"
	"sync"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// Call is one call recorded by Client.
type Call struct {
	// Method is the short CSI method name, e.g. "NodeStageVolume", or
	// "NodeCapabilities", "InvalidateCapabilities" and "Close".
	Method string
	// Request is the request passed in, nil for methods without one.
	Request proto.Message
}

// Client is a scripted stand-in for *csiclient.Client with the same method
// set for the identity and node calls, in the style of nomad's
// plugins/csi/fake. Set the Next* fields to script the answers: they apply
// to every later call until changed. Errors are returned the way the real
// client returns them: requests are validated with
// csiclient.ValidateRequest and errors are classified with
// csiclient.Classify, so a status.Error(codes.DeadlineExceeded, ...) comes
// back as csiclient.ErrUncertain and NotFound from NodeUnstageVolume as
// csiclient.ErrAlreadyDone.
//
// The methods are safe for concurrent use. Tests that change or read the
// fields while calls may be running must hold Mu.
type Client struct {
	Mu sync.Mutex

	// Name and EndpointPath are returned by DriverName and Endpoint.
	Name         string
	EndpointPath string

	NextGetPluginInfoResponse *csi.GetPluginInfoResponse
	NextGetPluginInfoErr      error
	GetPluginInfoCallCount    int64

	NextGetPluginCapabilitiesResponse *csi.GetPluginCapabilitiesResponse
	NextGetPluginCapabilitiesErr      error
	GetPluginCapabilitiesCallCount    int64

	NextProbeResponse *csi.ProbeResponse
	NextProbeErr      error
	ProbeCallCount    int64

	NextNodeGetInfoResponse *csi.NodeGetInfoResponse
	NextNodeGetInfoErr      error
	NodeGetInfoCallCount    int64

	NextNodeCapabilities            csiclient.NodeCapabilities
	NextNodeCapabilitiesErr         error
	NodeCapabilitiesCallCount       int64
	InvalidateCapabilitiesCallCount int64

	NextNodeStageVolumeErr   error
	NodeStageVolumeCallCount int64

	NextNodeUnstageVolumeErr   error
	NodeUnstageVolumeCallCount int64

	NextNodePublishVolumeErr   error
	NodePublishVolumeCallCount int64

	NextNodeUnpublishVolumeErr   error
	NodeUnpublishVolumeCallCount int64

	NextNodeGetVolumeStatsResponse *csi.NodeGetVolumeStatsResponse
	NextNodeGetVolumeStatsErr      error
	NodeGetVolumeStatsCallCount    int64

	// NextNodeExpandVolumeResponse nil answers with the requested size.
	NextNodeExpandVolumeResponse *csi.NodeExpandVolumeResponse
	NextNodeExpandVolumeErr      error
	NodeExpandVolumeCallCount    int64

	NextCloseErr   error
	CloseCallCount int64

	// Calls lists every call in arrival order.
	Calls []Call
}

// record appends a call; Mu must be held.
func (c *Client) record(method string, req proto.Message) {
	c.Calls = append(c.Calls, Call{Method: method, Request: req})
}

// fail validates req and returns the classified form of next; Mu must be held.
func (c *Client) fail(method string, req any, next error) error {
	if err := csiclient.ValidateRequest(req); err != nil {
		return csiclient.Classify(c.Name, method, err)
	}
	return csiclient.Classify(c.Name, method, next)
}

// DriverName returns Name.
func (c *Client) DriverName() string {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	return c.Name
}

// Endpoint returns EndpointPath.
func (c *Client) Endpoint() string {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	return c.EndpointPath
}

// GetPluginInfo returns NextGetPluginInfoResponse (by default Name) or
// NextGetPluginInfoErr.
func (c *Client) GetPluginInfo(context.Context) (*csi.GetPluginInfoResponse, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.GetPluginInfoCallCount++
	c.record("GetPluginInfo", nil)
	if err := c.fail("GetPluginInfo", nil, c.NextGetPluginInfoErr); err != nil {
		return nil, err
	}
	if c.NextGetPluginInfoResponse == nil {
		return &csi.GetPluginInfoResponse{Name: c.Name}, nil
	}
	return c.NextGetPluginInfoResponse, nil
}

// GetPluginCapabilities returns NextGetPluginCapabilitiesResponse (by
// default none) or NextGetPluginCapabilitiesErr.
func (c *Client) GetPluginCapabilities(context.Context) (*csi.GetPluginCapabilitiesResponse, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.GetPluginCapabilitiesCallCount++
	c.record("GetPluginCapabilities", nil)
	if err := c.fail("GetPluginCapabilities", nil, c.NextGetPluginCapabilitiesErr); err != nil {
		return nil, err
	}
	if c.NextGetPluginCapabilitiesResponse == nil {
		return &csi.GetPluginCapabilitiesResponse{}, nil
	}
	return c.NextGetPluginCapabilitiesResponse, nil
}

// Probe returns NextProbeResponse (by default ready) or NextProbeErr.
func (c *Client) Probe(context.Context) (*csi.ProbeResponse, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.ProbeCallCount++
	c.record("Probe", nil)
	if err := c.fail("Probe", nil, c.NextProbeErr); err != nil {
		return nil, err
	}
	if c.NextProbeResponse == nil {
		return &csi.ProbeResponse{}, nil
	}
	return c.NextProbeResponse, nil
}

// NodeGetInfo returns NextNodeGetInfoResponse (by default empty) or
// NextNodeGetInfoErr.
func (c *Client) NodeGetInfo(context.Context) (*csi.NodeGetInfoResponse, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodeGetInfoCallCount++
	c.record("NodeGetInfo", nil)
	if err := c.fail("NodeGetInfo", nil, c.NextNodeGetInfoErr); err != nil {
		return nil, err
	}
	if c.NextNodeGetInfoResponse == nil {
		return &csi.NodeGetInfoResponse{}, nil
	}
	return c.NextNodeGetInfoResponse, nil
}

// NodeCapabilities returns NextNodeCapabilities or NextNodeCapabilitiesErr
// (classified as from NodeGetCapabilities). It does not cache.
func (c *Client) NodeCapabilities(context.Context) (csiclient.NodeCapabilities, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodeCapabilitiesCallCount++
	c.record("NodeCapabilities", nil)
	if err := c.fail("NodeGetCapabilities", nil, c.NextNodeCapabilitiesErr); err != nil {
		return csiclient.NodeCapabilities{}, err
	}
	return c.NextNodeCapabilities, nil
}

// InvalidateCapabilities counts the call.
func (c *Client) InvalidateCapabilities() {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.InvalidateCapabilitiesCallCount++
	c.record("InvalidateCapabilities", nil)
}

// NodeStageVolume returns NextNodeStageVolumeErr.
func (c *Client) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodeStageVolumeCallCount++
	c.record("NodeStageVolume", req)
	return c.fail("NodeStageVolume", req, c.NextNodeStageVolumeErr)
}

// NodeUnstageVolume returns NextNodeUnstageVolumeErr.
func (c *Client) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodeUnstageVolumeCallCount++
	c.record("NodeUnstageVolume", req)
	return c.fail("NodeUnstageVolume", req, c.NextNodeUnstageVolumeErr)
}

// NodePublishVolume returns NextNodePublishVolumeErr.
func (c *Client) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodePublishVolumeCallCount++
	c.record("NodePublishVolume", req)
	return c.fail("NodePublishVolume", req, c.NextNodePublishVolumeErr)
}

// NodeUnpublishVolume returns NextNodeUnpublishVolumeErr.
func (c *Client) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodeUnpublishVolumeCallCount++
	c.record("NodeUnpublishVolume", req)
	return c.fail("NodeUnpublishVolume", req, c.NextNodeUnpublishVolumeErr)
}

// NodeGetVolumeStats returns NextNodeGetVolumeStatsResponse (by default
// empty) or NextNodeGetVolumeStatsErr.
func (c *Client) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodeGetVolumeStatsCallCount++
	c.record("NodeGetVolumeStats", req)
	if err := c.fail("NodeGetVolumeStats", req, c.NextNodeGetVolumeStatsErr); err != nil {
		return nil, err
	}
	if c.NextNodeGetVolumeStatsResponse == nil {
		return &csi.NodeGetVolumeStatsResponse{}, nil
	}
	return c.NextNodeGetVolumeStatsResponse, nil
}

// NodeExpandVolume returns NextNodeExpandVolumeResponse (by default the
// requested size) or NextNodeExpandVolumeErr.
func (c *Client) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.NodeExpandVolumeCallCount++
	c.record("NodeExpandVolume", req)
	if err := c.fail("NodeExpandVolume", req, c.NextNodeExpandVolumeErr); err != nil {
		return nil, err
	}
	if c.NextNodeExpandVolumeResponse == nil {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}, nil
	}
	return c.NextNodeExpandVolumeResponse, nil
}

// Close returns NextCloseErr.
func (c *Client) Close() error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	c.CloseCallCount++
	c.record("Close", nil)
	return c.NextCloseErr
}
