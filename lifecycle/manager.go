package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/policy"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/populator"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconstruct"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Drivers is what the lifecycle needs of the driver registry;
// *registry.Registry implements it.
type Drivers interface {
	// Client returns a registered driver's connection.
	Client(name string) (*csiclient.Client, bool)
	// Driver returns a registered driver's registration (node ID, ...).
	Driver(name string) (registry.Driver, bool)
	// Subscribe registers an observer of registrations.
	Subscribe(fn func(registry.Event))
}

// Policies gives drivers' CSIDriver policies; *policy.Store implements it.
type Policies interface {
	Get(driverName string) policy.Policy
	OnChange(fn func(driverName string))
	HasSynced() bool
}

// Config configures a Manager.
type Config struct {
	// Client talks to the API server. Exactly one of Client and Standalone
	// is set.
	Client kubernetes.Interface
	// Standalone, instead of Client, runs the node without an API server:
	// pods and the objects they reference come from it (a manifest
	// directory), volumes are attached by the agent itself
	// (lifecycle/localattach), and status goes to logs, Snapshot and the
	// metrics only.
	Standalone StandaloneSource
	// NodeName is the node whose pods this agent serves.
	NodeName string
	// RootDir is the agent's root directory (kubelet layout below it).
	RootDir string
	// Drivers and Policies come from the driver layer.
	Drivers  Drivers
	Policies Policies
	// Registerer receives the lifecycle metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// RemoveTerminatingPods tears down the volumes of pods marked for
	// deletion, for nodes that have no kubelet.
	RemoveTerminatingPods bool
	// CompletePodDeletion deletes a pod marked for deletion (grace period
	// 0, UID precondition) once its volumes are torn down, as a kubelet does
	// after its containers stop: for nodes where the agent is the only
	// agent. It needs Client and RemoveTerminatingPods.
	CompletePodDeletion bool
	// ClusterWideInformers caches every PVC, PV and VolumeAttachment instead
	// of watching the referenced ones by name (small clusters only).
	ClusterWideInformers bool
	// ResyncPeriod is the reconciler's periodic resync; 0 means 5m.
	ResyncPeriod time.Duration
	// Reconciler tunes the reconciler (workers, backoff); the wiring fields
	// are filled in by the Manager. Reconciler.Ready, when set, is told of
	// every pod whose volumes became ready, besides the Manager's metrics.
	Reconciler reconciler.Config
}

// Manager runs the lifecycle of one node.
type Manager struct {
	cfg    Config
	layout paths.Layout
	world  *asw.World
	desire *dsw.Store

	// ready is set once reconstruction is done and the desired state synced.
	ready atomic.Bool
	// synced is closed at the same moment.
	synced chan struct{}
	// operations hands Run's operations to the front endpoint (Operations).
	operations operationsHandle
}

// New validates cfg and returns a Manager; Run starts it.
func New(cfg Config) (*Manager, error) {
	var errs []error
	if (cfg.Client == nil) == (cfg.Standalone == nil) {
		errs = append(errs, errors.New("exactly one of client and standalone source is required"))
	}
	if cfg.CompletePodDeletion && (cfg.Client == nil || !cfg.RemoveTerminatingPods) {
		errs = append(errs, errors.New("completing pod deletion needs a client and RemoveTerminatingPods"))
	}
	if cfg.NodeName == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if cfg.Drivers == nil || cfg.Policies == nil {
		errs = append(errs, errors.New("drivers and policies are required"))
	}
	layout, err := paths.New(cfg.RootDir)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("lifecycle: %w", err)
	}
	return &Manager{cfg: cfg, layout: layout, world: asw.New(asw.Options{}), desire: dsw.New(), synced: make(chan struct{})}, nil
}

// Ready reports whether the actual state was reconstructed and the desired
// state has seen every pod: /readyz.
func (m *Manager) Ready() bool { return m.ready.Load() }

// Snapshot returns every volume the agent holds, for the status API.
func (m *Manager) Snapshot() []asw.VolumeStatus { return m.world.Snapshot() }

// Run reconstructs the actual state, then runs the sources, the populator,
// the reconciler and the outputs until ctx ends. It never tears anything
// down on its way out.
func (m *Manager) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	mounter := mount.New("")
	if _, err := reconstruct.Run(ctx, m.layout, mounter, m.world); err != nil {
		return fmt.Errorf("reconstruct actual state: %w", err)
	}

	registerer := m.cfg.Registerer
	if registerer == nil {
		// Nobody gathers this registry: the metrics are recorded and dropped.
		registerer = prometheus.NewRegistry()
	}
	met, err := metrics.New(metrics.Config{Registerer: registerer, Volumes: m.volumeCounts})
	if err != nil {
		return err
	}
	queues := status.QueueOptions{MetricsProvider: met.WorkqueueProvider()}
	var in inputs
	if m.cfg.Standalone != nil {
		in, err = m.standaloneInputs(ctx)
	} else {
		in, err = m.clusterInputs(ctx, queues)
	}
	if err != nil {
		return err
	}
	defer in.shutdown()
	pop, err := populator.New(populator.Config{
		Source: in.source, DesiredState: m.desire, Policies: m.cfg.Policies,
		NodeName: m.cfg.NodeName, RemoveTerminatingPods: m.cfg.RemoveTerminatingPods,
	})
	if err != nil {
		return err
	}
	ops, err := operations.New(operations.Config{
		RootDir: m.layout.Root(), NodeName: m.cfg.NodeName,
		Drivers:     operations.ClientLookup(m.cfg.Drivers.Client),
		Policies:    m.cfg.Policies,
		Attachments: in.attachments,
		State:       m.world,
		Secrets:     in.secrets,
		Tokens:      in.tokens,
		Mounts:      mounter,
		Observer:    met,
	})
	if err != nil {
		return err
	}
	m.operations.set(ops)
	rcfg := m.cfg.Reconciler
	rcfg.Desired, rcfg.Actual, rcfg.Operations = m.desire, m.world, in.wrap(ops)
	rcfg.Policies, rcfg.Drivers, rcfg.Synced = m.cfg.Policies, registered{m.cfg.Drivers}, pop.Synced()
	rcfg.Status, rcfg.Events, rcfg.InUse = in.status, in.events, in.inUse
	rcfg.Ready = met
	if m.cfg.Reconciler.Ready != nil {
		rcfg.Ready = readyObservers{met, m.cfg.Reconciler.Ready}
	}
	rcfg.MetricsProvider = met.WorkqueueProvider()
	if m.cfg.ResyncPeriod != 0 {
		rcfg.ResyncPeriod = m.cfg.ResyncPeriod
	}
	rec, err := reconciler.New(rcfg)
	if err != nil {
		return err
	}
	m.desire.Subscribe(rec.DesiredStateHandler())
	in.connect(rec)
	m.cfg.Policies.OnChange(rec.PolicyChanged)
	m.cfg.Drivers.Subscribe(func(ev registry.Event) {
		if ev.Type == registry.Registered {
			rec.DriverRegistered(ev.Driver)
			in.driverRegistered(ev.Driver)
		}
	})

	var wg sync.WaitGroup
	for _, run := range in.run {
		wg.Go(func() { run(ctx) })
	}
	wg.Go(func() {
		if err := pop.Run(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Populator stopped")
		}
	})
	wg.Go(func() { rec.Run(ctx) })
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-pop.Synced():
			m.ready.Store(true)
			close(m.synced)
			logger.Info("Volume lifecycle ready: actual state reconstructed, desired state synced")
		}
	})
	wg.Wait()
	return nil
}

func (m *Manager) volumeCounts() metrics.VolumeCounts {
	desired := m.desire.Counts().PodVolumesByDriver
	actual := map[string]int{}
	for _, v := range m.world.Snapshot() {
		actual[v.Driver] += max(len(v.Pods), 1)
	}
	return metrics.VolumeCounts{Desired: desired, Actual: actual}
}

// registered adapts the registry to the reconciler's Drivers.
type registered struct{ drivers Drivers }

func (r registered) Registered(name string) bool {
	_, ok := r.drivers.Client(name)
	return ok
}

// readyObservers tells each of its observers.
type readyObservers []reconciler.ReadyObserver

func (o readyObservers) ObservePodReady(pod volume.PodInfo, firstSeen, ready time.Time) {
	for _, obs := range o {
		obs.ObservePodReady(pod, firstSeen, ready)
	}
}
