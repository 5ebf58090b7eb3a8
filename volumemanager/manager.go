package volumemanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
	"github.com/csi-volmgr/csi-volmgr/driver/policy"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source/manifests"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/kubeversion"
)

// VolumeManager runs the CSI volume lifecycle of one node's pods: it finds
// the node's CSI drivers, publishes them in CSINode, and stages, publishes,
// unpublishes and unstages the volumes of the node's pods. Build it with
// New, then Run it.
type VolumeManager struct {
	cfg      Config
	registry *registry.Registry
	policies lifecycle.Policies
	manager  *lifecycle.Manager
	metrics  *metricsRegistry
	csi      *csiclient.Metrics

	// Cluster mode only: factory holds the informers to start, nodeInfo
	// publishes drivers and the CSINode, node keeps the Node with
	// RegisterNode (nil otherwise).
	factory  informers.SharedInformerFactory
	nodeInfo *nodeinfo.Manager
	node     *nodeKeeper
	// allocatable refreshes the drivers' allocatable counts (cluster mode).
	allocatable *nodeinfo.AllocatableRefresher
	// features are the API server's, by its version (kubeversion): set
	// once by detectServer before the lifecycle runs (cluster mode), the
	// newest minor's in standalone mode. serverKnown is closed then.
	features    atomic.Pointer[kubeversion.Features]
	serverKnown chan struct{}
	// standalone is the manifest source in standalone mode.
	standalone *manifests.Source
	// socket serves Handler on SocketPath; listener serves tcpHandler
	// when Config.HTTPEndpoint is set, with guard in cluster mode (nil in
	// standalone mode), behind failures, its limit of failed
	// authentications per caller address.
	socket, listener net.Listener
	guard            *apiauth.Guard
	tcpTLS           *tcpTLS
	failures         *apiauth.FailureLimiter
	// httpRefused counts what the TCP endpoint refused, by reason.
	httpRefused *prometheus.CounterVec
	// waiters wake the runtime's waits for a pod's volumes.
	waiters *podWaiters
	// runID names this run of the agent in the marks of the running-pods
	// reports (RunningPodsBeginPath): a mark of another run is refused.
	runID string
	// lock is held on the root directory from New until Run returns.
	lock *rootLock
}

// New checks cfg and builds a VolumeManager; nothing runs before Run. Its
// errors are the user's to fix. ctx carries the logger.
//
// New takes the lock of the root directory (LockFile) before it touches
// anything below it, and fails if another volume manager holds it; Run
// gives it up when it returns.
func New(ctx context.Context, cfg Config) (_ *VolumeManager, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.RootDir, 0o750); err != nil {
		return nil, &ConfigError{Field: "RootDir", Err: fmt.Errorf("%s: %w", cfg.RootDir, err)}
	}
	lock, err := lockRoot(cfg.RootDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.release()
		}
	}()
	if err := checkWritable(cfg.RootDir); err != nil {
		return nil, err
	}
	vm := &VolumeManager{cfg: cfg, lock: lock, metrics: newMetricsRegistry(), csi: csiclient.NewMetrics(), runID: newRunID(),
		serverKnown: make(chan struct{})}
	vm.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.NewCollector())
	vm.httpRefused = newHTTPRefused(vm.metrics)
	if err := vm.newBackend(ctx); err != nil {
		return nil, err
	}
	var nodeInfo registry.NodeInfoPublisher
	if vm.nodeInfo != nil {
		nodeInfo = ownedNodeInfo{vm: vm, inner: vm.nodeInfo}
	}
	if vm.registry, err = registry.New(registry.Config{
		Dir: cfg.RegistrationDir, NodeInfo: nodeInfo, CSITimeout: cfg.CSITimeout, Metrics: vm.csi,
		RetryBaseDelay: cfg.Tuning.RegistryRetryBaseDelay, RetryMaxDelay: cfg.Tuning.RegistryRetryMaxDelay,
	}); err != nil {
		return nil, err
	}
	vm.waiters = newPodWaiters(func(uid types.UID) int { return len(vm.manager.PodVolumes(uid)) })
	if err := vm.newAllocatable(); err != nil {
		return nil, err
	}
	if vm.node != nil {
		vm.registry.Subscribe(func(registry.Event) { vm.node.DriversChanged() })
	}
	lcfg := lifecycle.Config{
		NodeName: cfg.NodeName, RootDir: cfg.RootDir,
		WaitForContainersStopped: cfg.WaitForContainersStopped,
		PodObserver:              vm.waiters,
		Drivers:                  lifecycleDrivers{vm.registry}, Policies: vm.policies,
		Registerer:                       vm.metrics,
		RemoveTerminatingPods:            cfg.RemoveTerminatingPods,
		CompletePodDeletion:              cfg.RegisterNode,
		ClusterWideInformers:             cfg.ClusterWideInformers,
		SettledObjectResync:              settledObjectResync(cfg.SettledObjectResync),
		GetOnly:                          cfg.NodeIdentity,
		NodeKept:                         cfg.RegisterNode,
		ResyncPeriod:                     cfg.ResyncPeriod,
		Changes:                          cfg.Changes,
		Reconciler:                       cfg.Tuning.Reconciler,
		SELinux:                          cfg.Tuning.SELinux,
		SELinuxMountReadWriteOncePodOnly: vm.seLinuxMountReadWriteOncePodOnly,
	}
	if vm.standalone != nil {
		newest := kubeversion.Newest()
		vm.features.Store(&newest)
		close(vm.serverKnown)
		lcfg.Standalone = vm.standalone
	} else {
		lcfg.Client, lcfg.ReportClient = cfg.KubeClient, cfg.ReportClient
	}
	if vm.allocatable != nil {
		lcfg.AttachLimits = attachLimits{vm.allocatable}
	}
	if vm.manager, err = lifecycle.New(ctx, lcfg); err != nil {
		return nil, err
	}
	if vm.node != nil {
		vm.node.owner = vm.manager.NodeOwner()
	}
	reportRejections(vm.registry, vm.manager)
	if err := vm.listen(); err != nil {
		return nil, err
	}
	return vm, nil
}

// newBackend reads the manifest directory in standalone mode, or sets up
// the CSIDriver cache, the node info publisher and (RegisterNode) the Node
// keeper on the API server.
func (vm *VolumeManager) newBackend(ctx context.Context) error {
	cfg := vm.cfg
	if cfg.Manifests != "" {
		src, err := manifests.New(ctx, manifests.Config{Dir: cfg.Manifests, NodeName: cfg.NodeName, Debounce: cfg.Tuning.ManifestsDebounce})
		if err != nil {
			return &ConfigError{Field: "Manifests", Err: fmt.Errorf("%s: %w", cfg.Manifests, err)}
		}
		vm.standalone, vm.policies = src, src.Policies()
		return nil
	}
	vm.factory = informers.NewSharedInformerFactory(cfg.KubeClient, 0)
	policies, err := policy.New(ctx, vm.factory.Storage().V1().CSIDrivers(), volume.PolicyFromCSIDriver, volume.Policy.Equal)
	if err != nil {
		return err
	}
	vm.policies = policies
	if vm.nodeInfo, err = nodeinfo.New(nodeinfo.Config{Client: cfg.KubeClient, NodeName: cfg.NodeName}); err != nil {
		return err
	}
	if cfg.RegisterNode {
		vm.node = newNodeKeeper(cfg.KubeClient, cfg.NodeName, cfg.Tuning.NodeLeaseDuration, cfg.Tuning.NodeStatusInterval)
		vm.node.expectDrivers(cfg.ExpectedDrivers, vm.driverRegistered, vm.driversSynced, cfg.NodeIdentity)
		vm.node.shape(cfg.NodeCapacity, cfg.NodeLabels, cfg.NodeTaints)
	}
	return nil
}

// Ready tells whether the volume manager may be relied on: the agent owns
// its Node (OwnerLabel), the actual state is rebuilt from disk, the
// desired state has seen every pod, the drivers found at start have been
// handled once and the CSIDriver objects are cached.
func (vm *VolumeManager) Ready() bool {
	owned, _ := vm.NodeOwned()
	return owned && vm.manager.Ready() && vm.registry.HasSynced() && vm.policies.HasSynced()
}

// Drivers returns the registry of the node's CSI drivers: who is
// registered, and a subscription to registrations.
func (vm *VolumeManager) Drivers() *registry.Registry { return vm.registry }

// Volumes returns every volume the agent holds, with its pods.
func (vm *VolumeManager) Volumes() []asw.VolumeStatus { return vm.manager.Snapshot() }

// Metrics returns the agent's metrics, as /metrics serves them.
func (vm *VolumeManager) Metrics() prometheus.Gatherer {
	return prometheus.Gatherers{vm.metrics, vm.csi}
}

// Run starts every part and returns when ctx ends, after the steps in
// flight finished, or when a part fails. It never unmounts anything on its
// way out: the state lives under the root directory and the next start
// picks it up. Call it once; it gives up the root directory's lock when it
// returns.
func (vm *VolumeManager) Run(ctx context.Context) error {
	defer vm.lock.release()
	logger := klog.FromContext(ctx)
	if vm.factory != nil {
		vm.factory.Start(ctx.Done())
	}
	// The API socket and the health checks are served from the start, also
	// while the Node is being registered through an API server outage: the
	// exec probes ask the socket, /livez passes while the agent merely
	// waits, and /readyz fails saying why (the kubelet's behaviour). A
	// liveness probe that failed there would restart the agent into the
	// same wait, into a CrashLoopBackOff that outlasts the outage.
	var wg sync.WaitGroup
	stopServing := vm.serveHTTP(ctx, &wg)
	if vm.node != nil {
		// The Node goes first: driver registration writes into it.
		if err := vm.node.Register(ctx); err != nil && ctx.Err() == nil {
			stopServing()
			wg.Wait()
			return err
		}
	}

	// runCtx ends on a signal or when a part fails. The driver connections
	// outlive it until the lifecycle has returned, so that the steps still
	// in flight at shutdown finish instead of failing with "the client
	// connection is closing".
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	driversCtx, stopDrivers := context.WithCancel(context.WithoutCancel(runCtx))
	defer stopDrivers()
	errs := make(chan error, 3)
	part := func(name string, run func() error) {
		wg.Go(func() {
			err := run()
			if err != nil {
				stopRun(fmt.Errorf("%s: %w", name, err))
			}
			errs <- err
		})
	}
	part("driver registry", func() error { return vm.registry.Run(driversCtx) })
	part("volume lifecycle", func() error {
		defer stopDrivers()
		if vm.standalone == nil {
			vm.detectServer(runCtx)
		}
		return vm.manager.Run(runCtx)
	})
	part("front endpoint", func() error { return vm.runFront(runCtx) })
	if vm.node != nil {
		wg.Go(func() { vm.node.Run(runCtx) })
	}
	if vm.nodeInfo != nil {
		wg.Go(func() { vm.ensureCSINode(runCtx) })
		wg.Go(func() { vm.runAllocatable(runCtx) })
	}
	logger.Info("csi-volmgr running", "node", vm.cfg.NodeName, "rootDir", vm.cfg.RootDir,
		"registrationDir", vm.cfg.RegistrationDir, "socket", SocketPath(vm.cfg.RootDir),
		"httpEndpoint", vm.cfg.HTTPEndpoint, "version", vm.cfg.Version)
	<-runCtx.Done()
	if cause := context.Cause(runCtx); ctx.Err() == nil {
		logger.Error(cause, "Shutting down after a failure")
	} else {
		logger.Info("Shutting down: no new steps, waiting for the steps in flight")
	}
	stopServing()
	wg.Wait()
	close(errs)
	var runErr error
	for err := range errs {
		runErr = errors.Join(runErr, err)
	}
	logger.Info("Stopped")
	return runErr
}

// ensureCSINode creates the node's CSINode at start, as the kubelet does
// before any driver registers, so that the scheduler sees the node's CSI
// state; it retries with backoff until it succeeds or ctx ends (the Node
// may not exist yet when a runtime creates it after starting the agent).
// It waits for the agent to own the Node first: it creates nothing for a
// kubelet's Node.
func (vm *VolumeManager) ensureCSINode(ctx context.Context) {
	logger := klog.FromContext(ctx)
	delay := time.Second
	for {
		if vm.manager.NodeOwner().Wait(ctx) != nil {
			return
		}
		err := vm.nodeInfo.EnsureCSINode(ctx)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			return
		}
		logger.Info("Cannot create the CSINode yet; will retry", "node", vm.cfg.NodeName, "err", err, "retryIn", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Minute)
	}
}

// checkWritable makes sure the root directory is writable, so that a
// read-only file system fails at start with one clear line.
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".write-check-")
	if err != nil {
		return &ConfigError{Field: "RootDir", Err: fmt.Errorf("%s is not writable: %w", dir, err)}
	}
	_ = f.Close()
	return os.Remove(f.Name())
}

// settledObjectResync is Config.SettledObjectResync as lifecycle takes it
// (0: watch every referenced object).
func settledObjectResync(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultSettledObjectResync
	case d < 0:
		return 0
	}
	return d
}
