package csiclienttest

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// Servers are the CSI services a test server offers; nil ones are not
// registered, so calls to them fail with Unimplemented.
type Servers struct {
	Identity        csi.IdentityServer
	Node            csi.NodeServer
	Controller      csi.ControllerServer
	GroupController csi.GroupControllerServer
}

// Server is a real gRPC server on a unix socket.
type Server struct {
	endpoint string
	server   *grpc.Server
	// served is closed when Serve has returned.
	served   chan struct{}
	stopOnce sync.Once
}

// SocketPath returns the path of a socket named csi.sock in a new, short
// temporary directory removed at the end of the test. t.TempDir() paths can
// exceed the 107 bytes a unix socket address holds.
func SocketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatalf("creating socket directory: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing socket directory: %v", err)
		}
	})
	return filepath.Join(dir, "csi.sock")
}

// StartServer serves servers on a new unix socket and returns its path,
// usable as csiclient.Config.Endpoint. The server is stopped at the end of
// the test.
func StartServer(t testing.TB, servers Servers) string {
	t.Helper()
	return StartServerAt(t, SocketPath(t), servers).Endpoint()
}

// StartServerAt serves servers on a unix socket at endpoint, which must not
// exist, and returns the running server. Stop it to simulate a driver going
// away; start another one at the same endpoint to simulate its restart. It is
// stopped at the end of the test in any case.
func StartServerAt(t testing.TB, endpoint string, servers Servers) *Server {
	t.Helper()
	listener, err := net.Listen("unix", endpoint)
	if err != nil {
		t.Fatalf("listening on %s: %v", endpoint, err)
	}
	s := &Server{
		endpoint: endpoint,
		server:   grpc.NewServer(),
		served:   make(chan struct{}),
	}
	if servers.Identity != nil {
		csi.RegisterIdentityServer(s.server, servers.Identity)
	}
	if servers.Node != nil {
		csi.RegisterNodeServer(s.server, servers.Node)
	}
	if servers.Controller != nil {
		csi.RegisterControllerServer(s.server, servers.Controller)
	}
	if servers.GroupController != nil {
		csi.RegisterGroupControllerServer(s.server, servers.GroupController)
	}
	go func() {
		defer close(s.served)
		if err := s.server.Serve(listener); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving CSI on %s: %v", endpoint, err)
		}
	}()
	t.Cleanup(s.Stop)
	return s
}

// Endpoint returns the socket path.
func (s *Server) Endpoint() string { return s.endpoint }

// Stop closes the listener (removing the socket file) and every connection,
// cancelling calls in flight, and waits for the server to finish. It is
// idempotent.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.server.Stop()
		<-s.served
	})
}
