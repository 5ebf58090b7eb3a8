package plugintest

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// Registrar is a plugin-registration socket served by the test process for a plugin started
// without Options.RegistrationDir: the node-driver-registrar sidecar of a real node plugin pod,
// which keeps running while the driver container restarts, so that a restart of the plugin
// process registers nothing again.
type Registrar struct {
	// Socket is the registration socket, <dir>/<name>-reg.sock.
	Socket string

	getInfo atomic.Int64
}

// StartRegistrar serves the registration API for p in dir until the test ends.
func StartRegistrar(t testing.TB, dir string, p *Plugin) *Registrar {
	t.Helper()
	r := &Registrar{Socket: plugin.RegistrationSocket(dir, p.Name)}
	lis, err := net.Listen("unix", r.Socket)
	if err != nil {
		t.Fatalf("listen on registration socket: %v", err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == registerapi.Registration_GetInfo_FullMethodName {
			r.getInfo.Add(1)
		}
		return handler(ctx, req)
	}))
	registerapi.RegisterRegistrationServer(srv, plugin.NewRegistrationServer(p.Name, p.Endpoint))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("registration server: %v", err)
		}
		_ = os.Remove(r.Socket)
	})
	return r
}

// GetInfoCalls counts the GetInfo calls so far: one per registration attempt.
func (r *Registrar) GetInfoCalls() int64 { return r.getInfo.Load() }
