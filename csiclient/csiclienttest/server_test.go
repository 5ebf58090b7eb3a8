package csiclienttest_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
)

// identityOnly is a user-supplied server, as another package's test would
// bring, offering only the Identity service.
type identityOnly struct {
	csi.UnimplementedIdentityServer
}

func (identityOnly) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "identity-only.csi.test", VendorVersion: "1.0"}, nil
}

func connect(t *testing.T, endpoint string) *csiclient.Client {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := csiclient.New(ctx, csiclient.Config{DriverName: "test", Endpoint: endpoint})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestStartServerServesGivenServices(t *testing.T) {
	endpoint := csiclienttest.StartServer(t, csiclienttest.Servers{Identity: identityOnly{}})
	if len(endpoint) > 107 {
		t.Errorf("endpoint %q is too long for a unix socket", endpoint)
	}
	c := connect(t, endpoint)

	info, err := c.GetPluginInfo(t.Context())
	if err != nil || info.GetName() != "identity-only.csi.test" {
		t.Errorf("GetPluginInfo = (%v, %v), want identity-only.csi.test", info, err)
	}
	// The Node service was not given, so it is not served.
	if _, err := c.NodeGetInfo(t.Context()); status.Code(err) != codes.Unimplemented || !csiclient.IsFinal(err) {
		t.Errorf("NodeGetInfo on a server without Node service = %v, want final Unimplemented", err)
	}
}

func TestServerStopAndRestartAtSameEndpoint(t *testing.T) {
	endpoint := csiclienttest.SocketPath(t)
	first := csiclienttest.StartServerAt(t, endpoint, csiclienttest.Servers{Identity: identityOnly{}})
	if first.Endpoint() != endpoint {
		t.Errorf("Endpoint() = %q, want %q", first.Endpoint(), endpoint)
	}

	first.Stop()
	first.Stop() // idempotent
	if _, err := os.Stat(endpoint); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket still exists after Stop: %v", err)
	}

	d := csiclienttest.NewDriver("second.csi.test", "node-2")
	csiclienttest.StartServerAt(t, endpoint, d.Servers())
	c := connect(t, endpoint)
	info, err := c.NodeGetInfo(t.Context())
	if err != nil || info.GetNodeId() != "node-2" {
		t.Errorf("NodeGetInfo from the second server = (%v, %v), want node-2", info, err)
	}
}

func TestDriverScripting(t *testing.T) {
	d := csiclienttest.NewDriver("scripted.csi.test", "node-1")
	c := connect(t, csiclienttest.StartServer(t, d.Servers()))
	ctx := t.Context()

	d.SetHandler(csi.Node_NodeGetInfo_FullMethodName, func(context.Context, proto.Message) (proto.Message, error) {
		return &csi.NodeGetInfoResponse{NodeId: "n", MaxVolumesPerNode: 7}, nil
	})
	if info, err := c.NodeGetInfo(ctx); err != nil || info.GetMaxVolumesPerNode() != 7 {
		t.Errorf("NodeGetInfo with a handler = (%v, %v), want max volumes 7", info, err)
	}

	d.SetHandler(csi.Identity_GetPluginInfo_FullMethodName, func(context.Context, proto.Message) (proto.Message, error) {
		return &csi.ProbeResponse{}, nil
	})
	if _, err := c.GetPluginInfo(ctx); status.Code(err) != codes.Internal {
		t.Errorf("GetPluginInfo with a mistyped handler reply = %v, want Internal", err)
	}

	d.SetHandler(csi.Identity_GetPluginInfo_FullMethodName, nil)
	if info, err := c.GetPluginInfo(ctx); err != nil || info.GetName() != "scripted.csi.test" {
		t.Errorf("GetPluginInfo after removing the handler = (%v, %v), want the default reply", info, err)
	}

	started := make(chan struct{}, 1)
	d.Hang(csi.Node_NodeUnpublishVolume_FullMethodName, started)
	callCtx, cancel := context.WithCancel(ctx)
	go func() {
		<-started
		cancel()
	}()
	err := c.NodeUnpublishVolume(callCtx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "/t"})
	if status.Code(err) != codes.Canceled {
		t.Errorf("hanging NodeUnpublishVolume after cancel = %v, want Canceled", err)
	}

	reqs := d.Requests(csi.Node_NodeUnpublishVolume_FullMethodName)
	if len(reqs) != 1 || reqs[0].(*csi.NodeUnpublishVolumeRequest).GetTargetPath() != "/t" {
		t.Errorf("Requests(NodeUnpublishVolume) = %v, want the one request sent", reqs)
	}
	if n := d.CallCount(csi.Identity_GetPluginInfo_FullMethodName); n != 2 {
		t.Errorf("CallCount(GetPluginInfo) = %d, want 2", n)
	}
}
