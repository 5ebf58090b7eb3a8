package csiclienttest_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
)

// driverClient is the identity and node method set of *csiclient.Client;
// the fake must keep matching it.
type driverClient interface {
	DriverName() string
	Endpoint() string
	Close() error
	GetPluginInfo(context.Context) (*csi.GetPluginInfoResponse, error)
	GetPluginCapabilities(context.Context) (*csi.GetPluginCapabilitiesResponse, error)
	Probe(context.Context) (*csi.ProbeResponse, error)
	NodeGetInfo(context.Context) (*csi.NodeGetInfoResponse, error)
	NodeCapabilities(context.Context) (csiclient.NodeCapabilities, error)
	InvalidateCapabilities()
	NodeStageVolume(context.Context, *csi.NodeStageVolumeRequest) error
	NodeUnstageVolume(context.Context, *csi.NodeUnstageVolumeRequest) error
	NodePublishVolume(context.Context, *csi.NodePublishVolumeRequest) error
	NodeUnpublishVolume(context.Context, *csi.NodeUnpublishVolumeRequest) error
	NodeGetVolumeStats(context.Context, *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error)
	NodeExpandVolume(context.Context, *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error)
}

var (
	_ driverClient = &csiclient.Client{}
	_ driverClient = &csiclienttest.Client{}
)

func TestFakeClassifiesScriptedErrors(t *testing.T) {
	f := &csiclienttest.Client{Name: "fake.csi.test"}
	ctx := t.Context()
	mountCap := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}

	f.NextNodeStageVolumeErr = status.Error(codes.DeadlineExceeded, "slow")
	err := f.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mountCap})
	if !errors.Is(err, csiclient.ErrUncertain) || status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("NodeStageVolume = %v, want uncertain DeadlineExceeded", err)
	}

	f.NextNodeUnstageVolumeErr = status.Error(codes.NotFound, "gone")
	err = f.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s"})
	if !csiclient.IsAlreadyDone(err) {
		t.Errorf("NodeUnstageVolume = %v, want already done", err)
	}
	if rpcErr, ok := errors.AsType[*csiclient.RPCError](err); !ok || rpcErr.Driver != "fake.csi.test" || rpcErr.Method != "NodeUnstageVolume" {
		t.Errorf("NodeUnstageVolume error %#v does not name the driver and method", err)
	}

	f.NextNodeCapabilitiesErr = status.Error(codes.Unimplemented, "no node service")
	if _, err := f.NodeCapabilities(ctx); !csiclient.IsFinal(err) {
		t.Errorf("NodeCapabilities = %v, want final", err)
	}

	// Malformed requests fail as they do with the real client.
	if err := f.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v"}); !csiclient.IsFinal(err) || status.Code(err) != codes.InvalidArgument {
		t.Errorf("NodePublishVolume without target path = %v, want final InvalidArgument", err)
	}
}

func TestFakeDefaultsAndScriptedReplies(t *testing.T) {
	f := &csiclienttest.Client{Name: "fake.csi.test", EndpointPath: "/csi/csi.sock"}
	ctx := t.Context()

	if f.DriverName() != "fake.csi.test" || f.Endpoint() != "/csi/csi.sock" {
		t.Errorf("DriverName, Endpoint = %q, %q", f.DriverName(), f.Endpoint())
	}
	if info, err := f.GetPluginInfo(ctx); err != nil || info.GetName() != "fake.csi.test" {
		t.Errorf("default GetPluginInfo = (%v, %v), want the fake's name", info, err)
	}
	expanded, err := f.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: "v", VolumePath: "/p", CapacityRange: &csi.CapacityRange{RequiredBytes: 42},
	})
	if err != nil || expanded.GetCapacityBytes() != 42 {
		t.Errorf("default NodeExpandVolume = (%v, %v), want the requested 42 bytes", expanded, err)
	}

	f.NextNodeCapabilities = csiclient.NewNodeCapabilities(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	caps, err := f.NodeCapabilities(ctx)
	if err != nil || !caps.StageUnstage() || caps.Expand() {
		t.Errorf("NodeCapabilities = (%v, %v), want [STAGE_UNSTAGE_VOLUME]", caps, err)
	}
	f.InvalidateCapabilities()

	f.NextNodeGetInfoResponse = &csi.NodeGetInfoResponse{NodeId: "node-9"}
	if info, err := f.NodeGetInfo(ctx); err != nil || info.GetNodeId() != "node-9" {
		t.Errorf("NodeGetInfo = (%v, %v), want node-9", info, err)
	}

	var methods []string
	for _, c := range f.Calls {
		methods = append(methods, c.Method)
	}
	want := []string{"GetPluginInfo", "NodeExpandVolume", "NodeCapabilities", "InvalidateCapabilities", "NodeGetInfo"}
	if len(methods) != len(want) {
		t.Fatalf("Calls = %v, want %v", methods, want)
	}
	for i := range want {
		if methods[i] != want[i] {
			t.Fatalf("Calls = %v, want %v", methods, want)
		}
	}
	if f.InvalidateCapabilitiesCallCount != 1 || f.NodeGetInfoCallCount != 1 {
		t.Errorf("call counts: InvalidateCapabilities %d, NodeGetInfo %d, want 1 and 1",
			f.InvalidateCapabilitiesCallCount, f.NodeGetInfoCallCount)
	}
}

// TestFakeConcurrentUse runs calls from many goroutines while the test
// re-scripts the fake under Mu; run with -race.
func TestFakeConcurrentUse(t *testing.T) {
	f := &csiclienttest.Client{Name: "fake.csi.test"}
	ctx := t.Context()
	const workers, calls = 8, 50

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range calls {
				_ = f.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "/t"})
			}
		})
	}
	f.Mu.Lock()
	f.NextNodeUnpublishVolumeErr = status.Error(codes.Aborted, "busy")
	f.Mu.Unlock()
	wg.Wait()

	f.Mu.Lock()
	defer f.Mu.Unlock()
	if f.NodeUnpublishVolumeCallCount != workers*calls || len(f.Calls) != workers*calls {
		t.Errorf("NodeUnpublishVolumeCallCount = %d, len(Calls) = %d, want %d", f.NodeUnpublishVolumeCallCount, len(f.Calls), workers*calls)
	}
}
