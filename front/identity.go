package front

import (
	"context"
	"errors"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identityServer answers as the backend: its name, vendor version and
// plugin capabilities, and its health. Every call to the backend is bounded
// by Config.IdentityTimeout.
type identityServer struct {
	csi.UnimplementedIdentityServer
	s *Server
}

var _ csi.IdentityServer = &identityServer{}

// GetPluginInfo returns the backend's name and vendor version.
func (i *identityServer) GetPluginInfo(ctx context.Context, req *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	b, err := i.s.backend()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, i.s.cfg.IdentityTimeout)
	defer cancel()
	return b.Identity().GetPluginInfo(ctx, req)
}

// GetPluginCapabilities returns the backend's plugin capabilities.
func (i *identityServer) GetPluginCapabilities(ctx context.Context, req *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	b, err := i.s.backend()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, i.s.cfg.IdentityTimeout)
	defer cancel()
	return b.Identity().GetPluginCapabilities(ctx, req)
}

// Probe reports the backend's health: ready=false while it is not
// registered, the backend's own answer (or error) when it is, and
// Unavailable when it does not answer within IdentityTimeout.
func (i *identityServer) Probe(ctx context.Context, req *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	b, err := i.s.backend()
	if err != nil {
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
	}
	pctx, cancel := context.WithTimeout(ctx, i.s.cfg.IdentityTimeout)
	defer cancel()
	resp, err := b.Identity().Probe(pctx, req)
	if err != nil {
		// The backend's own side of the deadline may end the call first,
		// with DeadlineExceeded, before pctx reports it.
		if ctx.Err() == nil && (errors.Is(pctx.Err(), context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded) {
			return nil, status.Errorf(codes.Unavailable, "driver %q did not answer Probe within %v", i.s.cfg.Driver, i.s.cfg.IdentityTimeout)
		}
		return nil, err
	}
	return resp, nil
}
