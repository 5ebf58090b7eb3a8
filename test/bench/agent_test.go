package bench_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
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

// agent is csi-volmgr in this process: the volume manager the csi-volmgr
// command runs, plus the readyProbe.
type agent struct {
	vm    *volumemanager.VolumeManager
	probe *readyProbe
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

	a := &agent{probe: newReadyProbe(), requests: requests}
	vm, err := volumemanager.New(ctx, volumemanager.Config{
		NodeName: c.nodeName, RootDir: c.rootDir, RegistrationDir: c.regDir, KubeClient: client,
		ResyncPeriod: opts.ResyncPeriod.Duration, CSITimeout: opts.CSITimeout.Duration, ClusterWideInformers: c.clusterWide,
		Tuning: volumemanager.Tuning{Reconciler: reconciler.Config{
			VolumeWorkers: volumeWorkers, PodWorkers: podWorkers,
			Ready: a.probe,
		}},
	})
	if err != nil {
		b.Fatalf("volumemanager.New: %v", err)
	}
	a.vm = vm
	if c.onDriver != nil {
		vm.Drivers().Subscribe(c.onDriver)
	}

	runCtx, cancel := context.WithCancel(ctx)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	wg.Go(func() {
		if err := vm.Run(runCtx); err != nil && runCtx.Err() == nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("volume manager: %w", err))
			mu.Unlock()
		}
	})
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
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
		return vm.Ready(), nil
	})
	return a
}
