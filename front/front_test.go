package front_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/front/fronttest"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// env is the test plugin, registered through its registration socket, and
// the front endpoint in front of it, with clients of the front.
type env struct {
	p     *plugintest.Plugin
	stack *fronttest.Stack
	// dir is where the CO (the test) makes its staging and target paths.
	dir   string
	id    csi.IdentityClient
	ctrl  csi.ControllerClient
	node  csi.NodeClient
	steps *stepRecorder
}

// noAttach is the kubelet's default CSIDriver policy without attach, so
// that the reconciler's steps in these tests need no VolumeAttachment.
type noAttach struct{}

func (noAttach) Get(string) volume.Policy {
	p := volume.DefaultPolicy()
	p.AttachRequired = false
	return p
}

// start runs the test plugin with caps and the front in front of it.
func start(t *testing.T, caps plugin.Capabilities) *env {
	t.Helper()
	// Created first, so removed last: after the plugin unmounted.
	dir, root := t.TempDir(), t.TempDir()
	regDir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(regDir) })
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps, RegistrationDir: regDir})
	steps := &stepRecorder{}
	stack := fronttest.Start(t, fronttest.Options{
		Driver: p.Name, RegistrationDir: regDir, RootDir: root, Policies: noAttach{}, Observer: steps,
		IdentityTimeout: 2 * time.Second,
	})
	stack.WaitForDriver(t, p.Name, time.Minute)
	conn := dial(t, stack.Endpoint)
	return &env{
		p: p, stack: stack, dir: dir, steps: steps,
		id: csi.NewIdentityClient(conn), ctrl: csi.NewControllerClient(conn), node: csi.NewNodeClient(conn),
	}
}

// startStack runs the front for driver over a registry watching regDir.
func startStack(t *testing.T, driver, regDir string) *fronttest.Stack {
	t.Helper()
	return fronttest.Start(t, fronttest.Options{Driver: driver, RegistrationDir: regDir, Policies: noAttach{}, IdentityTimeout: 2 * time.Second})
}

// dial connects to a front endpoint.
func dial(t *testing.T, endpoint string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// testContext returns a context with a test logger and a deadline.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(4))))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	}
}

// createVolume creates a volume through the front's Controller service.
func (e *env) createVolume(t *testing.T, name string) string {
	t.Helper()
	resp, err := e.ctrl.CreateVolume(testContext(t), &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
	})
	if err != nil {
		t.Fatalf("CreateVolume through the front: %v", err)
	}
	return resp.GetVolume().GetVolumeId()
}

// path returns a CO path below the test's directory.
func (e *env) path(name string) string { return filepath.Join(e.dir, name) }

// calls returns the plugin's calls of the given methods, in the order they began.
func (e *env) calls(t *testing.T, methods ...string) []plugin.Call {
	t.Helper()
	entries, err := e.p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	var out []plugin.Call
	for _, c := range plugin.Calls(entries) {
		if slices.Contains(methods, c.Begin.Method) {
			out = append(out, c)
		}
	}
	return out
}

// waitForCall waits until the plugin's journal shows a call of method begin.
func (e *env) waitForCall(t *testing.T, method string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := e.p.WaitForJournal(ctx, func(entries []plugin.Entry) bool {
		for _, c := range plugin.Calls(entries) {
			if c.Begin.Method == method && !c.Done {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("waiting for %s to reach the plugin: %v", method, err)
	}
}

// wantCode fails t unless err has code.
func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, code)
	}
}

// step is one step the operations reported.
type step struct {
	driver string
	step   volume.Step
	err    error
}

// stepRecorder is an operations.Observer that keeps every step.
type stepRecorder struct {
	mu    sync.Mutex
	steps []step
}

func (r *stepRecorder) ObserveOperation(driver string, s volume.Step, _ volume.AccessType, _ bool, err error, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps = append(r.steps, step{driver, s, err})
}

// count returns how many steps s succeeded (ok) or failed.
func (r *stepRecorder) count(s volume.Step, ok bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.steps {
		if x.step == s && (x.err == nil) == ok {
			n++
		}
	}
	return n
}
