package front

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/redact"
	"github.com/csi-volmgr/csi-volmgr/csiclient/unixsock"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Defaults of Config.
const (
	// DefaultIdentityTimeout bounds an Identity call to the backend.
	DefaultIdentityTimeout = 10 * time.Second
	// DefaultShutdownGrace bounds how long calls in flight may finish once
	// the server stops.
	DefaultShutdownGrace = 30 * time.Second
)

// ErrInvalidConfig is wrapped by the error New returns for an unusable
// Config.
var ErrInvalidConfig = errors.New("invalid front endpoint config")

// Config configures a Server.
type Config struct {
	// Endpoint is the unix socket to serve, an absolute path or a unix://
	// URL (see csiclient.ParseEndpoint), bound with mode 0600. A stale
	// socket there is replaced.
	Endpoint string
	// Driver is the name of the registered driver to front.
	Driver string
	// Drivers finds the driver's connection at call time.
	Drivers Drivers
	// Operations runs the Node calls through the lifecycle.
	Operations Operations
	// IdentityTimeout bounds every Identity call to the backend, Probe
	// included, so a hung backend is reported instead of waited for; 0
	// means DefaultIdentityTimeout.
	IdentityTimeout time.Duration
	// ShutdownGrace bounds how long calls in flight may finish when the
	// server stops; 0 means DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Registerer receives csi_volmgr_front_operations_seconds; nil records
	// nothing.
	Registerer prometheus.Registerer
}

// Server is the front endpoint. Start it, then Wait; it stops when Start's
// context ends. Every call is logged at V(5) with its secrets stripped, gets
// a logger with the driver and method in its context, is timed in
// csi_volmgr_front_operations_seconds, and leaves with an error that
// toGRPCError produced (errors.go).
type Server struct {
	cfg      Config
	endpoint string
	latency  *prometheus.HistogramVec

	// mu guards srv and done, set by Start.
	mu   sync.Mutex
	srv  *grpc.Server
	done chan struct{}
	// serveErr is Serve's result, readable once done is closed.
	serveErr error
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	endpoint, err := csiclient.ParseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var errs []error
	if cfg.Driver == "" {
		errs = append(errs, errors.New("driver name is required"))
	}
	if cfg.Drivers == nil || cfg.Operations == nil {
		errs = append(errs, errors.New("drivers and operations are required"))
	}
	if cfg.IdentityTimeout < 0 || cfg.ShutdownGrace < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.IdentityTimeout == 0 {
		cfg.IdentityTimeout = DefaultIdentityTimeout
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	s := &Server{cfg: cfg, endpoint: endpoint}
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "csi_volmgr",
		Subsystem: "front",
		Name:      "operations_seconds",
		Help:      "Latency of the CSI calls the front endpoint served, by driver, method and gRPC status code.",
		Buckets:   []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
	}, []string{"driver_name", "method_name", "grpc_status_code"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.latency); err != nil {
			return nil, fmt.Errorf("registering the front endpoint metrics: %w", err)
		}
	}
	return s, nil
}

// Endpoint returns the socket path served.
func (s *Server) Endpoint() string { return s.endpoint }

// Start listens on the endpoint and serves in the background until ctx
// ends; then it lets the calls in flight finish for at most ShutdownGrace,
// cancels the rest and removes the socket. It returns once the socket
// accepts connections. ctx's logger becomes the calls' logger.
func (s *Server) Start(ctx context.Context) error {
	lis, err := listen(s.endpoint)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("driver", s.cfg.Driver, "endpoint", s.endpoint)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.intercept(logger)))
	csi.RegisterIdentityServer(srv, &identityServer{s: s})
	csi.RegisterControllerServer(srv, &controllerServer{s: s})
	csi.RegisterGroupControllerServer(srv, &groupControllerServer{s: s})
	csi.RegisterNodeServer(srv, &nodeServer{s: s})

	s.mu.Lock()
	if s.srv != nil {
		s.mu.Unlock()
		_ = lis.Close()
		return errors.New("front endpoint already started")
	}
	s.srv, s.done = srv, make(chan struct{})
	s.mu.Unlock()

	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.serveErr = fmt.Errorf("serving the front endpoint %s: %w", s.endpoint, err)
		}
	}()
	go func() {
		defer close(s.done)
		select {
		case <-ctx.Done():
			s.stop(logger)
		case <-served:
		}
		<-served
		if err := os.Remove(s.endpoint); err != nil && !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Failed to remove the front endpoint socket")
		}
		logger.Info("Front endpoint stopped")
	}()
	logger.Info("Serving the front endpoint")
	return nil
}

// stop stops serving: gracefully for at most ShutdownGrace, then by force.
func (s *Server) stop(logger klog.Logger) {
	stopped := make(chan struct{})
	go func() {
		s.srv.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(s.cfg.ShutdownGrace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		logger.Info("Calls still in flight after the shutdown grace period; cancelling them", "grace", s.cfg.ShutdownGrace)
		s.srv.Stop()
		<-stopped
	}
}

// Wait blocks until the server started by Start has stopped and returns
// why serving failed, nil after a normal stop.
func (s *Server) Wait() error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return errors.New("front endpoint not started")
	}
	<-done
	return s.serveErr
}

// listen binds the unix socket at path with mode 0600 (root only, as the
// kubelet's plugin sockets), replacing a stale socket left by an earlier
// process. Anything else at path is an error, never removed.
func listen(path string) (net.Listener, error) {
	lis, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("front endpoint: %w", err)
	}
	return lis, nil
}

// intercept is the one server interceptor: it puts a logger with the
// driver and method into the call's context, logs the request and reply at
// V(5) with secrets stripped, maps the error (toGRPCError) and records the
// call's latency.
func (s *Server) intercept(base klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := path.Base(info.FullMethod)
		logger := base.WithValues("method", method)
		ctx = klog.NewContext(ctx, logger)
		logger.V(5).Info("CSI call", "request", redact.CSI(req))
		start := time.Now()
		resp, err := handler(ctx, req)
		err = toGRPCError(err)
		code := status.Code(err)
		s.latency.WithLabelValues(s.cfg.Driver, info.FullMethod, code.String()).Observe(time.Since(start).Seconds())
		if err != nil {
			logger.V(5).Info("CSI call failed", "code", code.String(), "err", err)
			return nil, err
		}
		logger.V(5).Info("CSI call succeeded", "response", redact.CSI(resp))
		return resp, nil
	}
}

// backend returns the fronted driver's connection, or an error wrapping
// volume.ErrDriverNotRegistered.
func (s *Server) backend() (Backend, error) {
	c, ok := s.cfg.Drivers.Client(s.cfg.Driver)
	if !ok || c == nil {
		return nil, fmt.Errorf("%w: %q", volume.ErrDriverNotRegistered, s.cfg.Driver)
	}
	return c, nil
}
