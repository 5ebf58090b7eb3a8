package registry_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// waitTimeout bounds every wait on the registry; the registry itself answers
// in milliseconds, the margin is for a loaded CI machine.
const waitTimeout = 60 * time.Second

// shortDir returns a directory with a short path (unix socket paths are
// limited to 107 bytes), removed when t ends.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// events collects registry events for assertions.
type events struct {
	mu  sync.Mutex
	all []registry.Event
}

func (e *events) record(ev registry.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

func (e *events) snapshot() []registry.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]registry.Event(nil), e.all...)
}

// startRegistry runs a registry on dir until the test ends.
func startRegistry(t *testing.T, cfg registry.Config) (*registry.Registry, *events) {
	t.Helper()
	r, err := registry.New(cfg)
	if err != nil {
		t.Fatalf("registry.New: %v", err)
	}
	evs := &events{}
	r.Subscribe(evs.record)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registry.Run: %v", err)
		}
	})
	return r, evs
}

// eventually polls cond until it holds or waitTimeout passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, waitTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// fakeRegistrar is a plugin-registration server with a scripted GetInfo
// answer, as a misbehaving node-driver-registrar would serve.
type fakeRegistrar struct {
	registerapi.UnimplementedRegistrationServer
	info *registerapi.PluginInfo

	mu       sync.Mutex
	getInfos int
	statuses []*registerapi.RegistrationStatus
}

func (f *fakeRegistrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.getInfos++
	return f.info, nil
}

func (f *fakeRegistrar) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses = append(f.statuses, st)
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (f *fakeRegistrar) calls() (getInfos int, statuses []*registerapi.RegistrationStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.getInfos, append([]*registerapi.RegistrationStatus(nil), f.statuses...)
}

// serveRegistrar serves f on path until the test ends.
func serveRegistrar(t testing.TB, path string, f *fakeRegistrar) {
	t.Helper()
	t.Cleanup(serveRegistrarManual(t, path, f))
}

// serveRegistrarManual serves f on path and returns the function that stops
// it. The socket is created under a dot-name and renamed into place, so the
// registry never sees a socket that does not answer yet.
func serveRegistrarManual(t testing.TB, path string, f *fakeRegistrar) (stop func()) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	l, err := net.Listen("unix", tmp)
	if err != nil {
		t.Fatalf("listen %s: %v", tmp, err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	if err := os.Rename(tmp, path); err != nil {
		srv.Stop()
		t.Fatalf("rename socket into place: %v", err)
	}
	return srv.Stop
}

// registerInfo is the GetInfo answer node-driver-registrar gives for p.
func registerInfo(p *plugintest.Plugin) *registerapi.PluginInfo {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              p.Name,
		Endpoint:          p.Endpoint,
		SupportedVersions: []string{"1.0.0"},
	}
}

// serveSilent accepts connections on path and never answers: a registrar
// that hangs. Like serveRegistrar it listens before the socket appears under
// its name. It returns a counter of accepted connections.
func serveSilent(t testing.TB, path string) func() int {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	l, err := net.Listen("unix", tmp)
	if err != nil {
		t.Fatalf("listen %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("rename socket into place: %v", err)
	}
	var (
		mu       sync.Mutex
		accepted int
		conns    []net.Conn
	)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return accepted
	}
}
