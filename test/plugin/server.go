package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/mount-utils"
)

// shutdownGrace is how long Run waits for in-flight calls before cancelling them.
const shutdownGrace = 5 * time.Second

// Server is one test plugin: a CSI endpoint, optionally a plugin-registration socket, a journal and
// a fault injector, over a state directory.
type Server struct {
	cfg     Config
	d       *driver
	journal *journal
	faults  *faultInjector
}

// New validates cfg, creates the state directory and loads the state. It does not listen yet.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	// sysfs reports loop backing files by their real path, so the state directory must be one too.
	stateDir, err := filepath.Abs(cfg.StateDir)
	if err == nil {
		stateDir, err = filepath.EvalSymlinks(stateDir)
	}
	if err != nil {
		return nil, fmt.Errorf("resolve state directory: %w", err)
	}
	cfg.StateDir = stateDir
	volumesDir := filepath.Join(stateDir, volumesDirName)
	if err := os.MkdirAll(volumesDir, 0o750); err != nil {
		return nil, fmt.Errorf("create volumes directory: %w", err)
	}
	st, err := openStore(stateDir)
	if err != nil {
		return nil, err
	}
	j, err := openJournal(cfg.JournalPath)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		d:       &driver{cfg: cfg, volumesDir: volumesDir, store: st, mounter: mount.NewWithoutSystemd("")},
		journal: j,
	}
	if cfg.ControlFile != "" {
		s.faults = newFaultInjector(cfg.ControlFile, stateDir, j)
		s.d.faults = s.faults
	}
	s.d.fuse.size = func(id string) int64 {
		v, ok := s.d.store.get(id)
		if !ok {
			return 0
		}
		return v.filesystemBytes()
	}
	return s, nil
}

// Run serves until ctx is cancelled or a server fails. The CSI endpoint listens first; the
// registration socket, when configured, appears only once the endpoint accepts connections.
// On return both sockets are removed and the journal is closed.
func (s *Server) Run(ctx context.Context) (err error) {
	logger := klog.FromContext(ctx)
	defer func() {
		if cerr := s.journal.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	interceptors := grpc.ChainUnaryInterceptor(logInterceptor(logger), s.journal.interceptor, s.faults.interceptor)

	csiLis, err := listenUnix(s.cfg.Endpoint)
	if err != nil {
		return err
	}
	csiSrv := grpc.NewServer(interceptors)
	csi.RegisterIdentityServer(csiSrv, &identityServer{d: s.d})
	csi.RegisterControllerServer(csiSrv, &controllerServer{d: s.d})
	csi.RegisterNodeServer(csiSrv, &nodeServer{d: s.d})
	servers := []*grpc.Server{csiSrv}
	sockets := []string{s.cfg.Endpoint}
	errCh := make(chan error, 2)
	go func() { errCh <- csiSrv.Serve(csiLis) }()

	regSocket := ""
	if s.cfg.RegistrationDir != "" {
		regSocket = RegistrationSocket(s.cfg.RegistrationDir, s.cfg.Name)
		regLis, err := listenUnix(regSocket)
		if err != nil {
			stop(logger, servers, sockets)
			return err
		}
		regSrv := grpc.NewServer(interceptors)
		registerapi.RegisterRegistrationServer(regSrv, &registrationServer{name: s.cfg.Name, endpoint: s.cfg.Endpoint})
		// Stop the registration server first, so no agent finds the plugin while it goes away.
		servers = append([]*grpc.Server{regSrv}, servers...)
		sockets = append([]string{regSocket}, sockets...)
		go func() { errCh <- regSrv.Serve(regLis) }()
	}

	s.journal.recordOrLog(ctx, Entry{Event: EventStart, NodeID: s.cfg.NodeID, Message: s.cfg.Name})
	logger.Info("Serving", "driver", s.cfg.Name, "endpoint", s.cfg.Endpoint, "registrationSocket", regSocket, "node", s.cfg.NodeID)

	select {
	case <-ctx.Done():
		logger.Info("Shutting down")
	case err = <-errCh:
		err = fmt.Errorf("gRPC server stopped: %w", err)
	}
	stop(logger, servers, sockets)
	return err
}

// stop stops the servers in order, each gracefully for shutdownGrace and then forcibly, and removes the sockets.
func stop(logger klog.Logger, servers []*grpc.Server, sockets []string) {
	for _, srv := range servers {
		done := make(chan struct{})
		go func() {
			srv.GracefulStop()
			close(done)
		}()
		t := time.NewTimer(shutdownGrace)
		select {
		case <-done:
		case <-t.C:
			logger.Info("Calls still running after the grace period, cancelling them")
			srv.Stop()
			<-done
		}
		t.Stop()
	}
	for _, sock := range sockets {
		if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Failed to remove socket", "path", sock)
		}
	}
}

// listenUnix listens on a unix socket, first removing a stale socket left by a killed process.
func listenUnix(p string) (net.Listener, error) {
	if fi, err := os.Lstat(p); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", p)
		}
		if err := os.Remove(p); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	lis, err := net.Listen("unix", p)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", p, err)
	}
	return lis, nil
}

// logInterceptor puts a logger naming the method into the call's context and logs the call:
// its arrival at V(3) (Probe at V(5)), request and response at V(5) with secrets stripped, and errors.
func logInterceptor(base klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		logger := klog.LoggerWithValues(base, "method", path.Base(info.FullMethod))
		ctx = klog.NewContext(ctx, logger)
		level := 3
		if info.FullMethod == csi.Identity_Probe_FullMethodName {
			level = 5
		}
		logger.V(level).Info("gRPC call")
		if v := logger.V(5); v.Enabled() {
			v.Info("gRPC request", "request", protosanitizer.StripSecrets(req))
		}
		resp, err := handler(ctx, req)
		if err != nil {
			logger.Error(err, "gRPC call failed")
		} else if v := logger.V(5); v.Enabled() {
			v.Info("gRPC response", "response", protosanitizer.StripSecrets(resp))
		}
		return resp, err
	}
}
