package bench_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app"
	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
	"github.com/csi-volmgr/csi-volmgr/driver/policy"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
)

// The reconciler's concurrency: reconciler.Config's documented defaults
// (0 means 8 and 32), set explicitly so that the driver-bound ideal uses
// the same numbers.
const (
	volumeWorkers = 8
	podWorkers    = 32
)

// agentConfig says where the agent runs.
type agentConfig struct {
	// rest is the API server; the agent's client gets the `run` command's
	// default QPS and burst.
	rest     *rest.Config
	nodeName string
	rootDir  string
	regDir   string
	// onDriver is told every registry event, before the Manager is.
	onDriver func(registry.Event)
	// clusterWide runs the agent with --cluster-wide-informers.
	clusterWide bool
}

// agent is csi-volmgr in this process: policy store, node info, driver
// registry and lifecycle.Manager, wired as cmd/csi-volmgr/app/run.go wires
// them, plus the readyProbe.
type agent struct {
	manager *lifecycle.Manager
	drivers *registry.Registry
	metrics *prometheus.Registry
	probe   *readyProbe
	// requests is every API request the agent sent.
	requests *requestLog
	// stop ends the agent and waits for it; safe to call more than once.
	stop func()
}

// startAgent starts the agent and waits until it is ready (actual state
// reconstructed, desired state synced, drivers and policies synced). It is
// stopped when b ends.
func startAgent(ctx context.Context, b *testing.B, c agentConfig) *agent {
	b.Helper()
	opts := app.NewRunOptions()
	cfg := rest.CopyConfig(c.rest)
	cfg.QPS, cfg.Burst = opts.KubeAPIQPS, opts.KubeAPIBurst
	cfg.UserAgent = "csi-volmgr/bench"
	requests := &requestLog{}
	cfg.Wrap(requests.wrap)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatalf("agent client: %v", err)
	}

	a := &agent{metrics: prometheus.NewRegistry(), probe: newReadyProbe(), requests: requests}
	factory := informers.NewSharedInformerFactory(client, 0)
	policies, err := policy.New(ctx, factory.Storage().V1().CSIDrivers())
	if err != nil {
		b.Fatalf("policy.New: %v", err)
	}
	nodeInfo, err := nodeinfo.New(nodeinfo.Config{Client: client, NodeName: c.nodeName})
	if err != nil {
		b.Fatalf("nodeinfo.New: %v", err)
	}
	a.drivers, err = registry.New(registry.Config{
		Dir: c.regDir, NodeInfo: nodeInfo, CSITimeout: opts.CSITimeout, Metrics: csiclient.NewMetrics(),
	})
	if err != nil {
		b.Fatalf("registry.New: %v", err)
	}
	if c.onDriver != nil {
		a.drivers.Subscribe(c.onDriver)
	}
	a.manager, err = lifecycle.New(lifecycle.Config{
		Client: client, NodeName: c.nodeName, RootDir: c.rootDir,
		Drivers: a.drivers, Policies: policies,
		Registerer:           a.metrics,
		ResyncPeriod:         opts.ResyncPeriod,
		ClusterWideInformers: c.clusterWide,
		Reconciler: reconciler.Config{
			VolumeWorkers: volumeWorkers, PodWorkers: podWorkers,
			Ready: a.probe,
		},
	})
	if err != nil {
		b.Fatalf("lifecycle.New: %v", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	factory.Start(runCtx.Done())
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	record := func(what string, err error) {
		if err != nil && runCtx.Err() == nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			mu.Unlock()
		}
	}
	wg.Go(func() { record("registry", a.drivers.Run(runCtx)) })
	wg.Go(func() { record("manager", a.manager.Run(runCtx)) })
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			factory.Shutdown()
			if err := errors.Join(errs...); err != nil {
				b.Errorf("agent: %v", err)
			}
		})
	}
	b.Cleanup(a.stop)

	waitFor(ctx, b, 10*time.Millisecond, time.Minute, "agent ready", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if err := errors.Join(errs...); err != nil {
			return false, err
		}
		return a.manager.Ready() && a.drivers.HasSynced() && policies.HasSynced(), nil
	})
	return a
}
