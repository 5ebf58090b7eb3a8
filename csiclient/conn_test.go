package csiclient_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
)

// waitForConnection waits until done holds for c's connection state.
func waitForConnection(t *testing.T, c *csiclient.Client, what string, done func(connectivity.State) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := csiclient.WaitForConnection(ctx, c, done); err != nil {
		t.Fatalf("waiting for the connection to be %s: %v", what, err)
	}
}

func lost(s connectivity.State) bool  { return s != connectivity.Ready }
func ready(s connectivity.State) bool { return s == connectivity.Ready }

func TestNewFailsWhenNothingListens(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()

	start := time.Now()
	c, err := csiclient.New(ctx, csiclient.Config{DriverName: driverName, Endpoint: csiclienttest.SocketPath(t)})
	if err == nil {
		c.Close()
		t.Fatal("New succeeded without a driver listening")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("New error %v does not wrap context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("New returned after %v, want soon after the 300ms context deadline", elapsed)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	endpoint := csiclienttest.SocketPath(t)
	cases := map[string]csiclient.Config{
		"empty endpoint":    {DriverName: driverName},
		"relative endpoint": {DriverName: driverName, Endpoint: "csi.sock"},
		"tcp endpoint":      {DriverName: driverName, Endpoint: "tcp://127.0.0.1:10000"},
		"endpoint too long": {DriverName: driverName, Endpoint: "/" + strings.Repeat("x", 107)},
		"negative timeout":  {DriverName: driverName, Endpoint: endpoint, Timeout: -time.Second},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := csiclient.New(ctx, cfg)
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			if !errors.Is(err, csiclient.ErrInvalidConfig) {
				t.Errorf("New error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestEndpointAcceptsUnixScheme(t *testing.T) {
	d := csiclienttest.NewDriver(driverName, "node-1")
	endpoint := csiclienttest.StartServer(t, d.Servers())
	c := newClient(t, csiclient.Config{DriverName: driverName, Endpoint: "unix://" + endpoint})

	if c.Endpoint() != endpoint {
		t.Errorf("Endpoint() = %q, want %q", c.Endpoint(), endpoint)
	}
	if _, err := c.Probe(t.Context()); err != nil {
		t.Errorf("Probe: %v", err)
	}
}

func TestNodeCapabilitiesCached(t *testing.T) {
	d, c := startDriver(t)
	d.SetNodeCapabilities(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME, csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
	ctx := t.Context()

	for range 3 {
		caps, err := c.NodeCapabilities(ctx)
		if err != nil {
			t.Fatalf("NodeCapabilities: %v", err)
		}
		if !caps.StageUnstage() || !caps.Expand() || caps.Stats() || caps.VolumeMountGroup() || caps.SingleNodeMultiWriter() {
			t.Fatalf("NodeCapabilities = %v, want [STAGE_UNSTAGE_VOLUME EXPAND_VOLUME]", caps)
		}
	}
	if got := d.CallCount(csi.Node_NodeGetCapabilities_FullMethodName); got != 1 {
		t.Errorf("driver answered NodeGetCapabilities %d times for 3 calls, want 1", got)
	}

	// A re-registered driver may advertise something else.
	d.SetNodeCapabilities(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS)
	c.InvalidateCapabilities()
	caps, err := c.NodeCapabilities(ctx)
	if err != nil {
		t.Fatalf("NodeCapabilities after InvalidateCapabilities: %v", err)
	}
	if want := []csi.NodeServiceCapability_RPC_Type{csi.NodeServiceCapability_RPC_GET_VOLUME_STATS}; !slices.Equal(caps.Types(), want) {
		t.Errorf("NodeCapabilities after InvalidateCapabilities = %v, want %v", caps, want)
	}
	if got := d.CallCount(csi.Node_NodeGetCapabilities_FullMethodName); got != 2 {
		t.Errorf("driver answered NodeGetCapabilities %d times, want 2", got)
	}
}

func TestNodeCapabilitiesErrorNotCached(t *testing.T) {
	d, c := startDriver(t)
	d.SetNodeCapabilities(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	d.SetError(csi.Node_NodeGetCapabilities_FullMethodName, status.Error(codes.Unavailable, "starting"))

	if _, err := c.NodeCapabilities(t.Context()); !errors.Is(err, csiclient.ErrUncertain) {
		t.Fatalf("NodeCapabilities from a starting driver = %v, want uncertain", err)
	}
	d.SetError(csi.Node_NodeGetCapabilities_FullMethodName, nil)
	caps, err := c.NodeCapabilities(t.Context())
	if err != nil || !caps.StageUnstage() {
		t.Errorf("NodeCapabilities after the driver recovered = (%v, %v), want STAGE_UNSTAGE_VOLUME", caps, err)
	}
}

// TestDriverRestart kills the driver and starts a new one on the same
// socket: calls fail as uncertain while it is gone, then succeed again on
// the same Client, and the capabilities come from the new driver.
func TestDriverRestart(t *testing.T) {
	endpoint := csiclienttest.SocketPath(t)
	old := csiclienttest.NewDriver(driverName, "node-1")
	old.SetNodeCapabilities(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	oldServer := csiclienttest.StartServerAt(t, endpoint, old.Servers())
	c := newClient(t, csiclient.Config{DriverName: driverName, Endpoint: endpoint})
	ctx := t.Context()

	caps, err := c.NodeCapabilities(ctx)
	if err != nil || !caps.StageUnstage() {
		t.Fatalf("NodeCapabilities = (%v, %v), want STAGE_UNSTAGE_VOLUME", caps, err)
	}

	oldServer.Stop()
	waitForConnection(t, c, "lost", lost)
	if err := c.NodeStageVolume(ctx, stageRequest()); !errors.Is(err, csiclient.ErrUncertain) || status.Code(err) != codes.Unavailable {
		t.Errorf("NodeStageVolume without a driver = %v, want uncertain Unavailable", err)
	}

	restarted := csiclienttest.NewDriver(driverName, "node-1")
	restarted.SetNodeCapabilities(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS)
	csiclienttest.StartServerAt(t, endpoint, restarted.Servers())
	waitForConnection(t, c, "ready", ready)

	if err := c.NodeStageVolume(ctx, stageRequest()); err != nil {
		t.Errorf("NodeStageVolume after the driver restarted: %v", err)
	}
	if got := restarted.CallCount(csi.Node_NodeStageVolume_FullMethodName); got != 1 {
		t.Errorf("restarted driver got %d NodeStageVolume calls, want 1", got)
	}
	caps, err = c.NodeCapabilities(ctx)
	if err != nil {
		t.Fatalf("NodeCapabilities after the driver restarted: %v", err)
	}
	if caps.StageUnstage() || !caps.Stats() {
		t.Errorf("NodeCapabilities after the driver restarted = %v, want the new driver's [GET_VOLUME_STATS]", caps)
	}
	if got := restarted.CallCount(csi.Node_NodeGetCapabilities_FullMethodName); got != 1 {
		t.Errorf("restarted driver answered NodeGetCapabilities %d times, want 1", got)
	}
}

// TestCapabilitiesDroppedWhenConnectionLost checks that the cache goes with
// the connection even when no call is made while the driver is away, so no
// redial (and no OnConnectionLoss callback) happened before the next
// NodeCapabilities call.
func TestCapabilitiesDroppedWhenConnectionLost(t *testing.T) {
	endpoint := csiclienttest.SocketPath(t)
	old := csiclienttest.NewDriver(driverName, "node-1")
	old.SetNodeCapabilities(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	oldServer := csiclienttest.StartServerAt(t, endpoint, old.Servers())
	c := newClient(t, csiclient.Config{DriverName: driverName, Endpoint: endpoint})

	if _, err := c.NodeCapabilities(t.Context()); err != nil {
		t.Fatalf("NodeCapabilities: %v", err)
	}
	oldServer.Stop()
	waitForConnection(t, c, "lost", lost)

	restarted := csiclienttest.NewDriver(driverName, "node-1")
	restarted.SetNodeCapabilities(csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
	csiclienttest.StartServerAt(t, endpoint, restarted.Servers())

	// The Client reconnects by itself (it tells OnReconnect); no call has
	// been made since the loss, so only the lost connection told it that
	// its cached answer is stale. Calls made while its redial backs off
	// fail as uncertain, so the check waits for the connection first.
	waitForConnection(t, c, "back", ready)
	caps, err := c.NodeCapabilities(t.Context())
	if err != nil || caps.StageUnstage() || !caps.VolumeMountGroup() {
		t.Errorf("NodeCapabilities after reconnect = (%v, %v), want the new driver's [VOLUME_MOUNT_GROUP]", caps, err)
	}
}

func TestClose(t *testing.T) {
	d := csiclienttest.NewDriver(driverName, "node-1")
	endpoint := csiclienttest.StartServer(t, d.Servers())
	_, ctx := ktesting.NewTestContext(t)
	c, err := csiclient.New(ctx, csiclient.Config{DriverName: driverName, Endpoint: endpoint})
	if err != nil {
		t.Fatalf("New: %v", err)
	}

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: "/target"}); !errors.Is(err, csiclient.ErrUncertain) {
		t.Errorf("NodeUnpublishVolume after Close = %v, want uncertain", err)
	}
	if got := d.CallCount(csi.Node_NodeUnpublishVolume_FullMethodName); got != 0 {
		t.Errorf("driver got %d calls after Close, want 0", got)
	}
}

// TestReconnectReportedWithoutACall: a driver that goes away and listens
// again at its socket while nothing calls it is reconnected to by the
// Client itself, and Config.OnReconnect is told, once per recovery. gRPC
// alone leaves a lost connection idle until the next call.
func TestReconnectReportedWithoutACall(t *testing.T) {
	endpoint := csiclienttest.SocketPath(t)
	server := csiclienttest.StartServerAt(t, endpoint, csiclienttest.NewDriver(driverName, "node-1").Servers())
	reconnected := make(chan *csiclient.Client, 4)
	c := newClient(t, csiclient.Config{DriverName: driverName, Endpoint: endpoint,
		OnReconnect: func(c *csiclient.Client) { reconnected <- c }})

	for round := range 2 {
		server.Stop()
		waitForConnection(t, c, "lost", lost)
		server = csiclienttest.StartServerAt(t, endpoint, csiclienttest.NewDriver(driverName, "node-1").Servers())
		select {
		case got := <-reconnected:
			if got != c {
				t.Fatalf("round %d: OnReconnect got another Client", round)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: OnReconnect not called within 30s of the driver listening again", round)
		}
	}
	select {
	case <-reconnected:
		t.Error("OnReconnect called more often than the connection came back")
	case <-time.After(200 * time.Millisecond):
	}
}
