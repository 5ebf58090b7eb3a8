package fronttest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/front"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Options configures a Stack.
type Options struct {
	// Driver is the name of the driver to front. Required.
	Driver string
	// RegistrationDir is the directory the registry watches. Required; keep
	// it short, a unix socket path is limited to 107 bytes.
	RegistrationDir string
	// RootDir is the agent's root directory; default a new t.TempDir().
	RootDir string
	// Policies gives drivers' CSIDriver policies (the reconciler's steps
	// use them); default: every driver gets volume.DefaultPolicy().
	Policies operations.Policies
	// Observer receives every step; nil records nothing.
	Observer operations.Observer
	// IdentityTimeout is the front's Config.IdentityTimeout.
	IdentityTimeout time.Duration
	// Verbosity is the log level of the stack's ktesting logger; 0 means 2.
	Verbosity int
}

// Stack is a front endpoint over the real registry and operations.
type Stack struct {
	// Endpoint is the front's socket.
	Endpoint string
	// RootDir is the agent's root directory.
	RootDir string
	// Registry watches Options.RegistrationDir.
	Registry *registry.Registry
	// World is the actual state the operations record into.
	World *asw.World
	// Operations are shared by the front and whatever else the test drives
	// (e.g. the reconciler's steps).
	Operations *operations.Operations
	// Server is the front endpoint.
	Server *front.Server
}

// Start runs a Stack until the test ends. It fails t on any error.
func Start(t testing.TB, opts Options) *Stack {
	t.Helper()
	if opts.Driver == "" || opts.RegistrationDir == "" {
		t.Fatal("fronttest: Driver and RegistrationDir are required")
	}
	root := opts.RootDir
	if root == "" {
		root = t.TempDir()
	}
	sockDir, err := os.MkdirTemp("", "fr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })

	reg, err := registry.New(registry.Config{Dir: opts.RegistrationDir, RetryBaseDelay: 50 * time.Millisecond, RetryMaxDelay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	policies := opts.Policies
	if policies == nil {
		policies = defaultPolicies{}
	}
	world := asw.New(asw.Options{})
	ops, err := operations.New(operations.Config{
		RootDir:     root,
		NodeName:    "fronttest-node",
		Drivers:     operations.ClientLookup(reg.Client),
		Policies:    policies,
		Attachments: noAttachments{},
		State:       world,
		Observer:    opts.Observer,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := front.New(front.Config{
		Endpoint:        filepath.Join(sockDir, "front.sock"),
		Driver:          opts.Driver,
		Drivers:         reg,
		Operations:      ops,
		IdentityTimeout: opts.IdentityTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}

	// The stack outlives t.Context() until the cleanups below, so the
	// plugin's own cleanup is not raced by calls still in flight.
	verbosity := opts.Verbosity
	if verbosity == 0 {
		verbosity = 2
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(verbosity)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(t.Context()), logger))
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(ctx) }()
	if err := srv.Start(ctx); err != nil {
		cancel()
		t.Fatal(errors.Join(err, <-regDone))
	}
	t.Cleanup(func() {
		cancel()
		if err := srv.Wait(); err != nil {
			t.Errorf("front endpoint: %v", err)
		}
		if err := <-regDone; err != nil {
			t.Errorf("registry: %v", err)
		}
	})
	return &Stack{Endpoint: srv.Endpoint(), RootDir: root, Registry: reg, World: world, Operations: ops, Server: srv}
}

// WaitForDriver waits until the fronted driver is registered, failing t
// after timeout.
func (s *Stack) WaitForDriver(t testing.TB, name string, timeout time.Duration) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		_, ok := s.Registry.Client(name)
		return ok, nil
	})
	if err != nil {
		t.Fatalf("driver %q did not register: %v", name, err)
	}
}

// defaultPolicies gives every driver the kubelet's defaults.
type defaultPolicies struct{}

func (defaultPolicies) Get(string) volume.Policy { return volume.DefaultPolicy() }

// noAttachments is a VolumeAttachment cache without any object.
type noAttachments struct{}

func (noAttachments) Get(name string) (*storagev1.VolumeAttachment, error) {
	return nil, apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
}
