package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient/unixsock"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// SocketName is the name of the API socket in the root directory.
const SocketName = "csi-volmgr.sock"

// SocketPath returns the path of the API socket of the agent whose root
// directory is rootDir: a unix socket of mode 0600 owned by the agent's
// user (root), on which Handler serves the whole API to whoever may open
// it, as the kubelet's pod-resources socket.
func SocketPath(rootDir string) string { return filepath.Join(rootDir, SocketName) }

// openPaths are what the TCP endpoint serves to anyone: the health checks
// (with their named checks below them).
var openPaths = []string{"/healthz", "/healthz/", "/livez", "/livez/", "/readyz", "/readyz/"}

// metricsPath is served to anyone on a loopback endpoint, elsewhere only
// to callers authorized for get on nodes/metrics (AccessMetrics).
const metricsPath = "/metrics"

// guardedPaths are what the TCP endpoint serves only to callers the API
// server authenticated and authorized (apiauth), and never without one.
var guardedPaths = []string{"/api/", "/debug/pprof/"}

// tcpHandler is what the TCP endpoint serves of full: openPaths, and
// guardedPaths through guard, behind failures (which frees a request's
// place once guard let it through); with a nil guard (no API server) only
// openPaths. metricsPath is open on a loopback endpoint, elsewhere
// guarded as nodes/metrics, behind failures too.
func tcpHandler(full http.Handler, guard *apiauth.Guard, failures *apiauth.FailureLimiter, loopback bool) http.Handler {
	mux := http.NewServeMux()
	for _, p := range openPaths {
		mux.Handle(p, full)
	}
	if loopback {
		mux.Handle(metricsPath, full)
	} else if guard != nil {
		mux.Handle(metricsPath, failures.Wrap(guard.WrapAs(apiauth.MetricsSubresource, failures.Authenticated(full))))
	}
	if guard != nil {
		guarded := failures.Wrap(guard.Wrap(failures.Authenticated(full)))
		for _, p := range guardedPaths {
			mux.Handle(p, guarded)
		}
	}
	return mux
}

// listen binds the API socket and, with Config.HTTPEndpoint, the TCP
// endpoint (TLS unless plaintext, apiserve_tls.go), and builds the TCP
// endpoint's guard in cluster mode. The
// socket is bound with unixsock (0600 from the start; a stale socket is
// replaced, anything else at its path is an error).
func (vm *VolumeManager) listen() error {
	var err error
	if vm.socket, err = unixsock.Listen(SocketPath(vm.cfg.RootDir)); err != nil {
		return &ConfigError{Field: "RootDir", Err: fmt.Errorf("the API socket: %w", err)}
	}
	if vm.cfg.HTTPEndpoint == "" {
		return nil
	}
	if vm.tcpTLS, err = vm.newTCPTLS(); err != nil {
		return errors.Join(err, vm.socket.Close())
	}
	if vm.cfg.KubeClient != nil {
		if vm.guard, err = apiauth.New(vm.guardConfig(vm.tcpTLS)); err != nil {
			return errors.Join(err, vm.socket.Close())
		}
		vm.failures = vm.failureLimiter()
	}
	if vm.listener, err = net.Listen("tcp", vm.cfg.HTTPEndpoint); err != nil {
		return errors.Join(&ConfigError{Field: "HTTPEndpoint", Err: fmt.Errorf("%s: %w", vm.cfg.HTTPEndpoint, err)}, vm.socket.Close())
	}
	// The cap counts TCP connections, before their TLS handshake.
	vm.listener = vm.tcpTLS.wrap(vm.limitConnections(vm.listener))
	return nil
}

// serveHTTP serves Handler on the API socket and tcpHandler on the TCP
// endpoint until the returned stop is called, which gives the requests in
// flight 5 s and removes the socket. The requests' contexts carry ctx's
// logger. The TCP endpoint's server has the bounds of ServerLimits, and
// both bound request bodies (limitBodies).
func (vm *VolumeManager) serveHTTP(ctx context.Context, wg *sync.WaitGroup) (stop func()) {
	logger := klog.FromContext(ctx)
	base := context.WithoutCancel(ctx)
	full := limitBodies(vm.Handler())
	var servers []*http.Server
	serve := func(name string, l net.Listener, h http.Handler, bound func(*http.Server)) {
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return base }}
		bound(srv)
		servers = append(servers, srv)
		wg.Go(func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "HTTP server failed", "listener", name)
			}
		})
	}
	serve("socket", vm.socket, full, func(*http.Server) {})
	stopTLS := func() {}
	if vm.listener != nil {
		stopTLS = vm.tcpTLS.start(ctx, wg)
		serve("tcp", vm.listener, tcpHandler(full, vm.guard, vm.failures, vm.loopbackEndpoint()), vm.serverLimits().bound)
	}
	return func() {
		defer stopTLS()
		sctx, cancel := context.WithTimeout(base, 5*time.Second)
		defer cancel()
		for _, srv := range servers {
			_ = srv.Shutdown(sctx)
		}
	}
}
