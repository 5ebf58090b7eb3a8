package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
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
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Drivers is what the lifecycle needs of the driver registry;
// *registry.Registry implements it.
type Drivers interface {
	// Client returns a registered driver's connection.
	Client(name string) (*csiclient.Client, bool)
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
	// Client talks to the API server.
	Client kubernetes.Interface
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
	// ClusterWideInformers caches every PVC, PV and VolumeAttachment instead
	// of watching the referenced ones by name (small clusters only).
	ClusterWideInformers bool
	// ResyncPeriod is the reconciler's periodic resync; 0 means 5m.
	ResyncPeriod time.Duration
	// Reconciler tunes the reconciler (workers, backoff); the wiring fields
	// are filled in by the Manager.
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
}

// New validates cfg and returns a Manager; Run starts it.
func New(cfg Config) (*Manager, error) {
	var errs []error
	if cfg.Client == nil {
		errs = append(errs, errors.New("client is required"))
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
	return &Manager{cfg: cfg, layout: layout, world: asw.New(asw.Options{}), desire: dsw.New()}, nil
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

	met, err := metrics.New(metrics.Config{Registerer: m.cfg.Registerer, Volumes: m.volumeCounts})
	if err != nil {
		return err
	}
	src, err := source.New(ctx, source.Config{Client: m.cfg.Client, NodeName: m.cfg.NodeName, ClusterWideInformers: m.cfg.ClusterWideInformers})
	if err != nil {
		return fmt.Errorf("start sources: %w", err)
	}
	pop, err := populator.New(populator.Config{
		Source: src, DesiredState: m.desire, Policies: m.cfg.Policies,
		NodeName: m.cfg.NodeName, RemoveTerminatingPods: m.cfg.RemoveTerminatingPods,
	})
	if err != nil {
		return err
	}
	ops, err := operations.New(operations.Config{
		RootDir: m.layout.Root(), NodeName: m.cfg.NodeName,
		Drivers:     operations.ClientLookup(m.cfg.Drivers.Client),
		Policies:    m.cfg.Policies,
		Attachments: src.Attachments(),
		State:       m.world,
		Secrets:     source.NewSecrets(m.cfg.Client),
		Tokens:      tokenRequester{client: m.cfg.Client},
		Mounts:      mounter,
		Observer:    met,
	})
	if err != nil {
		return err
	}
	queues := status.QueueOptions{MetricsProvider: met.WorkqueueProvider()}
	conds, err := status.NewPodConditions(status.PodConditionsConfig{
		Client: m.cfg.Client, Queue: queues,
		CachedPod: func(namespace, name string) *corev1.Pod {
			pod, _ := src.PodByName(namespace, name)
			return pod
		},
	})
	if err != nil {
		return err
	}
	events, err := status.NewEvents(ctx, status.EventsConfig{Client: m.cfg.Client, NodeName: m.cfg.NodeName})
	if err != nil {
		return err
	}
	defer events.Shutdown()

	var rec *reconciler.Reconciler
	inUse, err := status.NewVolumesInUse(status.VolumesInUseConfig{
		Client: m.cfg.Client, NodeName: m.cfg.NodeName, Queue: queues,
		OnReported: func(names []volume.Name) { rec.Reported(names) },
	})
	if err != nil {
		return err
	}
	rcfg := m.cfg.Reconciler
	rcfg.Desired, rcfg.Actual, rcfg.Operations = m.desire, m.world, ops
	rcfg.Policies, rcfg.Drivers, rcfg.Synced = m.cfg.Policies, registered{m.cfg.Drivers}, pop.Synced()
	rcfg.Status, rcfg.Events, rcfg.InUse, rcfg.Ready = conds, events, inUse, met
	rcfg.MetricsProvider = met.WorkqueueProvider()
	if m.cfg.ResyncPeriod != 0 {
		rcfg.ResyncPeriod = m.cfg.ResyncPeriod
	}
	rec, err = reconciler.New(rcfg)
	if err != nil {
		return err
	}
	m.desire.Subscribe(rec.DesiredStateHandler())
	src.OnAttachmentChange(rec.AttachmentChanged)
	m.cfg.Drivers.Subscribe(func(ev registry.Event) {
		if ev.Type == registry.Registered {
			rec.DriverRegistered(ev.Driver)
		}
	})

	var wg sync.WaitGroup
	wg.Go(func() { src.Run(ctx) })
	wg.Go(func() {
		if err := pop.Run(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Populator stopped")
		}
	})
	wg.Go(func() { conds.Run(ctx, 4) })
	wg.Go(func() { inUse.Run(ctx) })
	wg.Go(func() { rec.Run(ctx) })
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-pop.Synced():
			m.ready.Store(true)
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
