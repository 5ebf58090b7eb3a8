package csiclient_test

import (
	"context"
	"errors"
	"fmt"
	"path"
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

const driverName = "test.csi.volmgr.io"

// newClient connects to endpoint and closes the client at the end of the test.
func newClient(t *testing.T, cfg csiclient.Config) *csiclient.Client {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := csiclient.New(ctx, cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// startDriver serves a scripted driver and returns it with a client for it.
func startDriver(t *testing.T) (*csiclienttest.Driver, *csiclient.Client) {
	t.Helper()
	d := csiclienttest.NewDriver(driverName, "node-1")
	endpoint := csiclienttest.StartServer(t, d.Servers())
	return d, newClient(t, csiclient.Config{DriverName: driverName, Endpoint: endpoint})
}

func mountCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func stageRequest() *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{
		VolumeId:          "vol-1",
		StagingTargetPath: "/var/lib/csi-volmgr/plugins/kubernetes.io/csi/d/abc/globalmount",
		VolumeCapability:  mountCapability(),
		PublishContext:    map[string]string{"devicePath": "/dev/sdb"},
	}
}

func publishRequest() *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{
		VolumeId:          "vol-1",
		StagingTargetPath: "/var/lib/csi-volmgr/plugins/kubernetes.io/csi/d/abc/globalmount",
		TargetPath:        "/var/lib/csi-volmgr/pods/uid/volumes/kubernetes.io~csi/pv-1/mount",
		VolumeCapability:  mountCapability(),
	}
}

// rpc is one typed Client call, named by its full gRPC method.
type rpc struct {
	method string
	call   func(context.Context, *csiclient.Client) error
}

// typedCalls lists every typed call of *Client.
var typedCalls = []rpc{
	{csi.Identity_GetPluginInfo_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.GetPluginInfo(ctx)
		return err
	}},
	{csi.Identity_GetPluginCapabilities_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.GetPluginCapabilities(ctx)
		return err
	}},
	{csi.Identity_Probe_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.Probe(ctx)
		return err
	}},
	{csi.Node_NodeGetInfo_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.NodeGetInfo(ctx)
		return err
	}},
	{csi.Node_NodeGetCapabilities_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.NodeCapabilities(ctx)
		return err
	}},
	{csi.Node_NodeStageVolume_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		return c.NodeStageVolume(ctx, stageRequest())
	}},
	{csi.Node_NodeUnstageVolume_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		return c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: "/staging"})
	}},
	{csi.Node_NodePublishVolume_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		return c.NodePublishVolume(ctx, publishRequest())
	}},
	{csi.Node_NodeUnpublishVolume_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		return c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: "/target"})
	}},
	{csi.Node_NodeGetVolumeStats_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: "/target"})
		return err
	}},
	{csi.Node_NodeExpandVolume_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", VolumePath: "/target"})
		return err
	}},
	{csi.Controller_ControllerGetCapabilities_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.ControllerCapabilities(ctx)
		return err
	}},
	{csi.Controller_ControllerPublishVolume_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		_, err := c.ControllerPublishVolume(ctx, controllerPublishRequest())
		return err
	}},
	{csi.Controller_ControllerUnpublishVolume_FullMethodName, func(ctx context.Context, c *csiclient.Client) error {
		return c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-1"})
	}},
}

func controllerPublishRequest() *csi.ControllerPublishVolumeRequest {
	return &csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-1", VolumeCapability: mountCapability()}
}

// TestErrorClassification makes the driver answer every method with every
// gRPC error code and checks the class, and that the driver's code and
// message are still reachable through the returned error.
func TestErrorClassification(t *testing.T) {
	d, c := startDriver(t)

	uncertain := map[codes.Code]bool{
		codes.Canceled: true, codes.DeadlineExceeded: true, codes.Unavailable: true,
		codes.ResourceExhausted: true, codes.Aborted: true,
	}
	teardown := map[string]bool{
		csi.Node_NodeUnstageVolume_FullMethodName:               true,
		csi.Node_NodeUnpublishVolume_FullMethodName:             true,
		csi.Controller_ControllerUnpublishVolume_FullMethodName: true,
	}

	for _, r := range typedCalls {
		for code := codes.Canceled; code <= codes.Unauthenticated; code++ {
			if code == codes.Unimplemented && r.method == csi.Controller_ControllerGetCapabilities_FullMethodName {
				continue // no Controller service: no capabilities (TestControllerCapabilities)
			}
			t.Run(path.Base(r.method)+"/"+code.String(), func(t *testing.T) {
				message := "driver says " + code.String()
				d.SetError(r.method, status.Error(code, message))
				defer d.SetError(r.method, nil)

				err := r.call(t.Context(), c)

				want := "final"
				switch {
				case uncertain[code]:
					want = "uncertain"
				case code == codes.NotFound && teardown[r.method]:
					want = "already done"
				}
				for name, class := range map[string]error{
					"final": csiclient.ErrFinal, "uncertain": csiclient.ErrUncertain, "already done": csiclient.ErrAlreadyDone,
				} {
					if got := errors.Is(err, class); got != (name == want) {
						t.Errorf("errors.Is(%v, Err %s) = %v, want %v", err, name, got, name == want)
					}
				}
				wrapped := fmt.Errorf("operation: %w", err)
				if got := status.Code(wrapped); got != code {
					t.Errorf("status.Code(wrapped error) = %v, want %v", got, code)
				}
				if st, ok := status.FromError(err); !ok || st.Code() != code || st.Message() != message {
					t.Errorf("status.FromError = (%v, %q, %v), want (%v, %q, true)", st.Code(), st.Message(), ok, code, message)
				}
				rpcErr, ok := errors.AsType[*csiclient.RPCError](wrapped)
				if !ok {
					t.Fatalf("errors.As(*RPCError) failed on %v", err)
				}
				if rpcErr.Driver != driverName || rpcErr.Method != path.Base(r.method) {
					t.Errorf("RPCError names driver %q method %q, want %q %q", rpcErr.Driver, rpcErr.Method, driverName, path.Base(r.method))
				}
			})
		}
	}
}

// TestCallsReachDriver checks successful calls: the driver gets the request
// as sent and the caller gets the driver's reply.
func TestCallsReachDriver(t *testing.T) {
	d, c := startDriver(t)
	ctx := t.Context()

	for _, r := range typedCalls {
		if err := r.call(ctx, c); err != nil {
			t.Errorf("%s: %v", r.method, err)
		}
		if got := d.CallCount(r.method); got != 1 {
			t.Errorf("%s reached the driver %d times, want 1", r.method, got)
		}
	}
	if got := d.Requests(csi.Node_NodeStageVolume_FullMethodName)[0]; !proto.Equal(got, stageRequest()) {
		t.Errorf("driver got NodeStageVolume %v, want %v", got, stageRequest())
	}
	if got := d.Requests(csi.Node_NodePublishVolume_FullMethodName)[0]; !proto.Equal(got, publishRequest()) {
		t.Errorf("driver got NodePublishVolume %v, want %v", got, publishRequest())
	}

	info, err := c.GetPluginInfo(ctx)
	if err != nil || info.GetName() != driverName {
		t.Errorf("GetPluginInfo = (%v, %v), want name %q", info, err, driverName)
	}
	node, err := c.NodeGetInfo(ctx)
	if err != nil || node.GetNodeId() != "node-1" {
		t.Errorf("NodeGetInfo = (%v, %v), want node ID node-1", node, err)
	}
	expanded, err := c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: "vol-1", VolumePath: "/target", CapacityRange: &csi.CapacityRange{RequiredBytes: 5 << 30},
	})
	if err != nil || expanded.GetCapacityBytes() != 5<<30 {
		t.Errorf("NodeExpandVolume = (%v, %v), want capacity %d", expanded, err, 5<<30)
	}
	if c.DriverName() != driverName {
		t.Errorf("DriverName() = %q, want %q", c.DriverName(), driverName)
	}
}

// TestInvalidRequestsNeverSent checks that requests missing a required field
// fail as final InvalidArgument without reaching the driver.
func TestInvalidRequestsNeverSent(t *testing.T) {
	d, c := startDriver(t)
	ctx := t.Context()

	noCapability := stageRequest()
	noCapability.VolumeCapability = nil
	cases := map[string]struct {
		method string
		call   func() error
	}{
		"stage without volume capability": {csi.Node_NodeStageVolume_FullMethodName, func() error {
			return c.NodeStageVolume(ctx, noCapability)
		}},
		"nil stage request": {csi.Node_NodeStageVolume_FullMethodName, func() error {
			return c.NodeStageVolume(ctx, nil)
		}},
		"unstage without staging path": {csi.Node_NodeUnstageVolume_FullMethodName, func() error {
			return c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1"})
		}},
		"publish without target path": {csi.Node_NodePublishVolume_FullMethodName, func() error {
			return c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", VolumeCapability: mountCapability()})
		}},
		"unpublish without volume id": {csi.Node_NodeUnpublishVolume_FullMethodName, func() error {
			return c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{TargetPath: "/target"})
		}},
		"stats without volume path": {csi.Node_NodeGetVolumeStats_FullMethodName, func() error {
			_, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1"})
			return err
		}},
		"controller publish without node id": {csi.Controller_ControllerPublishVolume_FullMethodName, func() error {
			req := controllerPublishRequest()
			req.NodeId = ""
			_, err := c.ControllerPublishVolume(ctx, req)
			return err
		}},
		"controller unpublish without volume id": {csi.Controller_ControllerUnpublishVolume_FullMethodName, func() error {
			return c.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{NodeId: "node-1"})
		}},
		"expand without volume id": {csi.Node_NodeExpandVolume_FullMethodName, func() error {
			_, err := c.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumePath: "/target"})
			return err
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			if !csiclient.IsFinal(err) || status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want a final InvalidArgument error", err)
			}
			if n := d.CallCount(tc.method); n != 0 {
				t.Errorf("driver received %d calls of %s, want 0", n, tc.method)
			}
		})
	}
}

// TestTimeout checks that a call to a driver that never answers ends after
// Config.Timeout as uncertain DeadlineExceeded, and that the driver saw that
// deadline.
func TestTimeout(t *testing.T) {
	d := csiclienttest.NewDriver(driverName, "node-1")
	endpoint := csiclienttest.StartServer(t, d.Servers())
	const timeout = 200 * time.Millisecond
	c := newClient(t, csiclient.Config{DriverName: driverName, Endpoint: endpoint, Timeout: timeout})

	deadlines := make(chan time.Time, 1)
	d.SetHandler(csi.Node_NodeStageVolume_FullMethodName, func(ctx context.Context, _ proto.Message) (proto.Message, error) {
		deadline, _ := ctx.Deadline()
		deadlines <- deadline
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	})

	start := time.Now()
	// The caller's own deadline is later, so Config.Timeout applies.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := c.NodeStageVolume(ctx, stageRequest())

	if !errors.Is(err, csiclient.ErrUncertain) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("NodeStageVolume on a hanging driver = %v, want uncertain DeadlineExceeded", err)
	}
	if deadline := <-deadlines; deadline.IsZero() || deadline.After(start.Add(timeout+time.Second)) {
		t.Errorf("driver saw deadline %v, want about %v after %v", deadline, timeout, start)
	}
}

// TestCallerDeadlineWins checks that a caller's deadline earlier than
// Config.Timeout bounds the call.
func TestCallerDeadlineWins(t *testing.T) {
	d, c := startDriver(t) // Timeout is the 2m default.
	d.Hang(csi.Node_NodePublishVolume_FullMethodName, nil)

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := c.NodePublishVolume(ctx, publishRequest())
	if !errors.Is(err, csiclient.ErrUncertain) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("NodePublishVolume with a short caller deadline = %v, want uncertain DeadlineExceeded", err)
	}
}

// TestCallerCancel checks that cancelling the caller's context ends a hanging
// call as uncertain Canceled.
func TestCallerCancel(t *testing.T) {
	d, c := startDriver(t)
	started := make(chan struct{}, 1)
	d.Hang(csi.Node_NodeUnstageVolume_FullMethodName, started)

	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-started
		cancel()
	}()
	err := c.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: "/staging"})
	if !errors.Is(err, csiclient.ErrUncertain) || status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled NodeUnstageVolume = %v, want uncertain Canceled", err)
	}
}

// TestPassThroughClients checks that Controller and GroupController reach
// the driver on the same connection and return its errors unclassified.
func TestPassThroughClients(t *testing.T) {
	d, c := startDriver(t)
	ctx := t.Context()

	d.SetHandler(csi.Controller_ControllerPublishVolume_FullMethodName, func(context.Context, proto.Message) (proto.Message, error) {
		return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"devicePath": "/dev/sdc"}}, nil
	})
	resp, err := c.Controller().ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-1"})
	if err != nil || resp.GetPublishContext()["devicePath"] != "/dev/sdc" {
		t.Fatalf("ControllerPublishVolume = (%v, %v), want devicePath /dev/sdc", resp, err)
	}

	d.SetError(csi.Controller_ControllerUnpublishVolume_FullMethodName, status.Error(codes.NotFound, "no such volume"))
	_, err = c.Controller().ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1"})
	if _, isRPCError := errors.AsType[*csiclient.RPCError](err); isRPCError {
		t.Errorf("pass-through error %v is classified, want the driver's error as is", err)
	}
	if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != "no such volume" {
		t.Errorf("ControllerUnpublishVolume error = %v, want NotFound %q", err, "no such volume")
	}

	// The test driver has no GroupController service.
	_, err = c.GroupController().GroupControllerGetCapabilities(ctx, &csi.GroupControllerGetCapabilitiesRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("GroupControllerGetCapabilities = %v, want Unimplemented", err)
	}

	if _, err := c.Identity().Probe(ctx, &csi.ProbeRequest{}); err != nil {
		t.Errorf("Identity().Probe: %v", err)
	}
	if got := d.CallCount(csi.Identity_Probe_FullMethodName); got != 1 {
		t.Errorf("driver got %d Probe calls, want 1", got)
	}
}

// TestControllerCapabilities checks the answer of ControllerCapabilities for
// a driver that advertises capabilities and for one without a Controller
// service, which has none (not an error).
func TestControllerCapabilities(t *testing.T) {
	d, c := startDriver(t)
	caps, err := c.ControllerCapabilities(t.Context())
	if err != nil || !caps.PublishUnpublish() || caps.SingleNodeMultiWriter() {
		t.Errorf("ControllerCapabilities = %v, %v; want PUBLISH_UNPUBLISH_VOLUME only", caps, err)
	}
	d.SetError(csi.Controller_ControllerGetCapabilities_FullMethodName, status.Error(codes.Unimplemented, "no controller"))
	caps, err = c.ControllerCapabilities(t.Context())
	if err != nil || caps.PublishUnpublish() {
		t.Errorf("ControllerCapabilities of a driver without a Controller service = %v, %v; want none and no error", caps, err)
	}
}
