package csiclienttest

import (
	"context"
	"slices"
	"sync"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Handler replaces the default behaviour of one Driver method. It returns
// the reply to send (nil for the default reply) or an error to fail the call
// with; a reply of the wrong type fails the call with Internal.
type Handler func(ctx context.Context, req proto.Message) (proto.Message, error)

// Driver is a minimal in-process CSI driver (Identity, Node and Controller
// services) whose answers can be scripted per method, for tests that need a
// real gRPC peer: serve it with StartServer(t, d.Servers()).
//
// By default it is ready, answers GetPluginInfo with its name and vendor
// version "test", NodeGetInfo with its node ID, NodeGetCapabilities with the
// capabilities set by SetNodeCapabilities, NodeExpandVolume with the
// requested size, ControllerGetCapabilities with PUBLISH_UNPUBLISH_VOLUME,
// and every other implemented method with an empty reply. Methods are named
// by their full gRPC name, e.g. csi.Node_NodeStageVolume_FullMethodName.
// A Driver is safe for concurrent use.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	csi.UnimplementedControllerServer

	mu sync.Mutex
	// name, nodeID and nodeCaps shape the default replies; guarded by mu.
	name     string
	nodeID   string
	nodeCaps []csi.NodeServiceCapability_RPC_Type
	// handlers by full method name; guarded by mu.
	handlers map[string]Handler
	// requests received, by full method name, in order; guarded by mu.
	requests map[string][]proto.Message
}

var (
	_ csi.IdentityServer   = &Driver{}
	_ csi.NodeServer       = &Driver{}
	_ csi.ControllerServer = &Driver{}
)

// NewDriver returns a Driver called name whose node ID is nodeID and which
// advertises no node capabilities.
func NewDriver(name, nodeID string) *Driver {
	return &Driver{
		name:     name,
		nodeID:   nodeID,
		handlers: map[string]Handler{},
		requests: map[string][]proto.Message{},
	}
}

// Servers returns d as Identity, Node and Controller server.
func (d *Driver) Servers() Servers {
	return Servers{Identity: d, Node: d, Controller: d}
}

// SetNodeCapabilities sets what NodeGetCapabilities advertises.
func (d *Driver) SetNodeCapabilities(caps ...csi.NodeServiceCapability_RPC_Type) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodeCaps = slices.Clone(caps)
}

// SetHandler makes h answer every later call of method; nil restores the
// default reply.
func (d *Driver) SetHandler(method string, h Handler) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h == nil {
		delete(d.handlers, method)
		return
	}
	d.handlers[method] = h
}

// SetError makes every later call of method fail with err (a status error,
// e.g. status.Error(codes.Internal, "boom")); nil restores the default reply.
func (d *Driver) SetError(method string, err error) {
	if err == nil {
		d.SetHandler(method, nil)
		return
	}
	d.SetHandler(method, func(context.Context, proto.Message) (proto.Message, error) { return nil, err })
}

// Hang makes every later call of method block until the caller gives up
// (its deadline passes or it cancels) and then fail with the matching code.
// If started is not nil, it receives one value per hanging call once the
// call has arrived; it should be buffered.
func (d *Driver) Hang(method string, started chan<- struct{}) {
	d.SetHandler(method, func(ctx context.Context, _ proto.Message) (proto.Message, error) {
		if started != nil {
			started <- struct{}{}
		}
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	})
}

// CallCount returns how many calls of method arrived.
func (d *Driver) CallCount(method string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.requests[method])
}

// Requests returns the requests of method received so far, in order.
func (d *Driver) Requests(method string) []proto.Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.requests[method])
}

// record stores req and returns the handler of method, if any.
func (d *Driver) record(method string, req proto.Message) Handler {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requests[method] = append(d.requests[method], req)
	return d.handlers[method]
}

// handle records a call and answers it with the method's handler or, when
// there is none or it returns no reply, with def().
func handle[Req, Resp proto.Message](ctx context.Context, d *Driver, method string, req Req, def func() Resp) (Resp, error) {
	var zero Resp
	if h := d.record(method, req); h != nil {
		reply, err := h(ctx, req)
		if err != nil {
			return zero, err
		}
		if reply != nil {
			resp, ok := reply.(Resp)
			if !ok {
				return zero, status.Errorf(codes.Internal, "csiclienttest: handler of %s returned %T, want %T", method, reply, zero)
			}
			return resp, nil
		}
	}
	return def(), nil
}

// GetPluginInfo implements csi.IdentityServer.
func (d *Driver) GetPluginInfo(ctx context.Context, req *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return handle(ctx, d, csi.Identity_GetPluginInfo_FullMethodName, req, func() *csi.GetPluginInfoResponse {
		d.mu.Lock()
		defer d.mu.Unlock()
		return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "test"}
	})
}

// GetPluginCapabilities implements csi.IdentityServer: CONTROLLER_SERVICE.
func (d *Driver) GetPluginCapabilities(ctx context.Context, req *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return handle(ctx, d, csi.Identity_GetPluginCapabilities_FullMethodName, req, func() *csi.GetPluginCapabilitiesResponse {
		return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
				Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
			}},
		}}}
	})
}

// Probe implements csi.IdentityServer: ready.
func (d *Driver) Probe(ctx context.Context, req *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return handle(ctx, d, csi.Identity_Probe_FullMethodName, req, func() *csi.ProbeResponse {
		return &csi.ProbeResponse{}
	})
}

// NodeGetInfo implements csi.NodeServer.
func (d *Driver) NodeGetInfo(ctx context.Context, req *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return handle(ctx, d, csi.Node_NodeGetInfo_FullMethodName, req, func() *csi.NodeGetInfoResponse {
		d.mu.Lock()
		defer d.mu.Unlock()
		return &csi.NodeGetInfoResponse{NodeId: d.nodeID}
	})
}

// NodeGetCapabilities implements csi.NodeServer.
func (d *Driver) NodeGetCapabilities(ctx context.Context, req *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return handle(ctx, d, csi.Node_NodeGetCapabilities_FullMethodName, req, func() *csi.NodeGetCapabilitiesResponse {
		d.mu.Lock()
		defer d.mu.Unlock()
		resp := &csi.NodeGetCapabilitiesResponse{}
		for _, t := range d.nodeCaps {
			resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
				Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
			})
		}
		return resp
	})
}

// NodeStageVolume implements csi.NodeServer.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	return handle(ctx, d, csi.Node_NodeStageVolume_FullMethodName, req, func() *csi.NodeStageVolumeResponse {
		return &csi.NodeStageVolumeResponse{}
	})
}

// NodeUnstageVolume implements csi.NodeServer.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	return handle(ctx, d, csi.Node_NodeUnstageVolume_FullMethodName, req, func() *csi.NodeUnstageVolumeResponse {
		return &csi.NodeUnstageVolumeResponse{}
	})
}

// NodePublishVolume implements csi.NodeServer.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	return handle(ctx, d, csi.Node_NodePublishVolume_FullMethodName, req, func() *csi.NodePublishVolumeResponse {
		return &csi.NodePublishVolumeResponse{}
	})
}

// NodeUnpublishVolume implements csi.NodeServer.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	return handle(ctx, d, csi.Node_NodeUnpublishVolume_FullMethodName, req, func() *csi.NodeUnpublishVolumeResponse {
		return &csi.NodeUnpublishVolumeResponse{}
	})
}

// NodeGetVolumeStats implements csi.NodeServer.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	return handle(ctx, d, csi.Node_NodeGetVolumeStats_FullMethodName, req, func() *csi.NodeGetVolumeStatsResponse {
		return &csi.NodeGetVolumeStatsResponse{}
	})
}

// NodeExpandVolume implements csi.NodeServer.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	return handle(ctx, d, csi.Node_NodeExpandVolume_FullMethodName, req, func() *csi.NodeExpandVolumeResponse {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}
	})
}

// ControllerGetCapabilities implements csi.ControllerServer.
func (d *Driver) ControllerGetCapabilities(ctx context.Context, req *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return handle(ctx, d, csi.Controller_ControllerGetCapabilities_FullMethodName, req, func() *csi.ControllerGetCapabilitiesResponse {
		return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
				Type: csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
			}},
		}}}
	})
}

// ControllerPublishVolume implements csi.ControllerServer.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	return handle(ctx, d, csi.Controller_ControllerPublishVolume_FullMethodName, req, func() *csi.ControllerPublishVolumeResponse {
		return &csi.ControllerPublishVolumeResponse{}
	})
}

// ControllerUnpublishVolume implements csi.ControllerServer.
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	return handle(ctx, d, csi.Controller_ControllerUnpublishVolume_FullMethodName, req, func() *csi.ControllerUnpublishVolumeResponse {
		return &csi.ControllerUnpublishVolumeResponse{}
	})
}
