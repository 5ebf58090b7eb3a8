package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
)

func newRunCommand() *cobra.Command {
	o := NewRunOptions()
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: discover CSI drivers and run the volume lifecycle of the node's pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			fg := featuregate.NewFeatureGate()
			if err := logsapi.AddFeatureGates(fg); err != nil {
				return err
			}
			if err := logsapi.ValidateAndApply(o.Logging, fg); err != nil {
				return fmt.Errorf("logging configuration: %w", err)
			}
			defer klog.Flush()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithName("csi-volmgr"))
			return run(ctx, o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// run starts every part of the agent and returns when ctx ends (SIGTERM or
// SIGINT), after the steps in flight finished; it never unmounts on the way
// out.
func run(ctx context.Context, o *RunOptions) error {
	logger := klog.FromContext(ctx)
	if err := checkRootDir(o.RootDir); err != nil {
		return err
	}
	b, err := newBackend(ctx, o)
	if err != nil {
		return err
	}
	var listener net.Listener
	if o.HTTPEndpoint != "" {
		if listener, err = net.Listen("tcp", o.HTTPEndpoint); err != nil {
			return fmt.Errorf("--http-endpoint %s: %w", o.HTTPEndpoint, err)
		}
	}

	promRegistry := prometheus.NewRegistry()
	promRegistry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	csiMetrics := csiclient.NewMetrics()

	policies := b.policies
	drivers, err := registry.New(registry.Config{Dir: o.RegistrationDir, NodeInfo: b.nodeInfo, CSITimeout: o.CSITimeout, Metrics: csiMetrics})
	if err != nil {
		return err
	}
	lcfg := b.lifecycleConfig(o)
	lcfg.NodeName, lcfg.RootDir, lcfg.Drivers, lcfg.Registerer, lcfg.ResyncPeriod = o.NodeName, o.RootDir, drivers, promRegistry, o.ResyncPeriod
	manager, err := lifecycle.New(lcfg)
	if err != nil {
		return err
	}
	if err := b.start(ctx); err != nil {
		return err
	}

	// runCtx ends on a signal or when a part of the agent fails. The driver
	// connections outlive it until the lifecycle has returned, so that the
	// steps still in flight at shutdown finish instead of failing with "the
	// client connection is closing".
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	driversCtx, stopDrivers := context.WithCancel(context.WithoutCancel(runCtx))
	defer stopDrivers()
	var wg sync.WaitGroup
	wg.Go(func() { b.keepNode(runCtx) })
	errs := make(chan error, 3)
	wg.Go(func() {
		err := drivers.Run(driversCtx)
		if err != nil {
			stopRun(fmt.Errorf("driver registry: %w", err))
		}
		errs <- err
	})
	wg.Go(func() {
		defer stopDrivers()
		err := manager.Run(runCtx)
		if err != nil {
			stopRun(fmt.Errorf("volume lifecycle: %w", err))
		}
		errs <- err
	})
	wg.Go(func() {
		err := runFront(runCtx, o, manager, drivers, promRegistry)
		if err != nil {
			stopRun(fmt.Errorf("front endpoint: %w", err))
		}
		errs <- err
	})
	var server *http.Server
	if listener != nil {
		server = &http.Server{
			Handler: newHTTPHandler(httpDeps{
				gatherer: prometheus.Gatherers{promRegistry, csiMetrics},
				ready:    func() bool { return manager.Ready() && drivers.HasSynced() && policies.HasSynced() },
				volumes:  manager.Snapshot,
				drivers:  drivers.List,
			}),
			ReadHeaderTimeout: 10 * time.Second,
		}
		wg.Go(func() {
			if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "HTTP server failed")
			}
		})
	}
	logger.Info("csi-volmgr running", "node", o.NodeName, "rootDir", o.RootDir, "registrationDir", o.RegistrationDir, "httpEndpoint", o.HTTPEndpoint, "version", version)
	<-runCtx.Done()
	if cause := context.Cause(runCtx); ctx.Err() == nil {
		logger.Error(cause, "Shutting down after a failure")
	} else {
		logger.Info("Shutting down: no new steps, waiting for the steps in flight")
	}
	if server != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = server.Shutdown(sctx)
		cancel()
	}
	wg.Wait()
	close(errs)
	var runErr error
	for err := range errs {
		runErr = errors.Join(runErr, err)
	}
	logger.Info("Stopped")
	return runErr
}

// checkRootDir makes sure the root directory exists and is writable, so that
// a read-only file system fails at start with one clear line.
func checkRootDir(dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("--root-dir %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".write-check-")
	if err != nil {
		return fmt.Errorf("--root-dir %s is not writable: %w", dir, err)
	}
	_ = f.Close()
	return os.Remove(f.Name())
}

func kubeConfig(o *RunOptions) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if o.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", o.Kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("no --kubeconfig and no in-cluster configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	cfg.UserAgent = "csi-volmgr/" + version
	return cfg, nil
}
