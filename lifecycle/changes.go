package lifecycle

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/mountcheck"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/republish"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/stats"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ChangesConfig tunes what the lifecycle does for volumes that change
// while in use: the mount check that repairs mounts broken by a driver's
// restart, the volume stats, the republish of requiresRepublish drivers.
// The zero value is the default.
type ChangesConfig struct {
	// MountCheckPeriod, when positive, checks the mounts of
	// MountCheckDrivers every period, on top of every registration of a
	// driver (which always checks that driver's mounts).
	MountCheckPeriod time.Duration
	// MountCheckDrivers are the drivers MountCheckPeriod applies to; empty
	// means all.
	MountCheckDrivers []string
	// StatsPeriod is how often the stats and health of every published
	// volume are collected from drivers with GET_VOLUME_STATS or
	// GET_VOLUME_HEALTH; 0 means the kubelet's 1m, negative disables it.
	StatsPeriod time.Duration
	// StatsConcurrency bounds the stats calls in flight; 0 means 4.
	StatsConcurrency int
	// RepublishPeriod is how often a volume of a driver whose CSIDriver has
	// requiresRepublish is published again; 0 means 1m, the kubelet's pod
	// sync. A driver with tokenRequests is republished at least every
	// tenth of its tokens' lifetime, so that it gets every refreshed token
	// (refreshed in the last fifth of the lifetime) before the old one
	// expires.
	RepublishPeriod time.Duration
	// TokenClock is the clock of the service account token cache; nil is
	// the real clock (tests move a fake one past a token's refresh time).
	TokenClock clock.PassiveClock
}

// podEvents is the status.Events method the change handlers record with.
type podEvents interface {
	Pod(pod volume.PodInfo, eventType, reason, message string)
}

// newMountChecker builds the mount check of the Manager's drivers and
// returns the operations the reconciler runs, observed by it.
func (m *Manager) newMountChecker(in inputs, steps reconciler.Operations) (reconciler.Operations, error) {
	cfg := mountcheck.Config{
		State: m.world, Desired: m.desire, Operations: m.ops,
		Requeue:        func(key volume.PodKey) { m.rec.Repair(key) },
		Synced:         m.pop.Synced(),
		Mounts:         m.mounter,
		Registerer:     m.cfg.Registerer,
		Period:         m.cfg.Changes.MountCheckPeriod,
		Drivers:        m.cfg.Changes.MountCheckDrivers,
		RetryBaseDelay: m.cfg.Reconciler.RetryBaseDelay, RetryMaxDelay: m.cfg.Reconciler.RetryMaxDelay,
	}
	if e, ok := in.events.(podEvents); ok {
		cfg.Events = e
	}
	checker, err := mountcheck.New(cfg)
	if err != nil {
		return nil, err
	}
	m.checker = checker
	m.cfg.Drivers.OnRegistered(checker.DriverRegistered)
	// A driver restarted next to a registrar that kept running registers
	// no more; its connection coming back is the sign (kubernetes#96361).
	m.cfg.Drivers.OnReconnected(checker.DriverRegistered)
	if err := m.newStats(in); err != nil {
		return nil, err
	}
	observed := checker.Observe(steps)
	rcfg := republish.Config{
		Desired: m.desire, Actual: m.world, Policies: m.cfg.Policies, Operations: observed,
		Period: m.cfg.Changes.RepublishPeriod, Synced: m.pop.Synced(),
		RetryBaseDelay: m.cfg.Reconciler.RetryBaseDelay, RetryMaxDelay: m.cfg.Reconciler.RetryMaxDelay,
	}
	if e, ok := in.events.(podEvents); ok {
		rcfg.Events = e
	}
	if m.republisher, err = republish.New(rcfg); err != nil {
		return nil, err
	}
	return observed, nil
}

// newStats builds the volume stats collector, unless disabled.
func (m *Manager) newStats(in inputs) error {
	if m.cfg.Changes.StatsPeriod < 0 {
		return nil
	}
	cfg := stats.Config{
		State: m.world, Desired: m.desire, Claims: in.source,
		Drivers: func(name string) (stats.Client, bool) {
			c, ok := m.cfg.Drivers.Client(name)
			if !ok || c == nil {
				return nil, false
			}
			return c, true
		},
		Registerer:  m.cfg.Registerer,
		Period:      m.cfg.Changes.StatsPeriod,
		Concurrency: m.cfg.Changes.StatsConcurrency,
		Synced:      m.pop.Synced(),
		// The reconciler is made after the collector.
		OnHealthChange: func(pods []types.UID) { m.rec.HealthChanged(pods) },
	}
	if e, ok := in.events.(podEvents); ok {
		cfg.Events = e
	}
	var err error
	m.stats, err = stats.New(cfg)
	return err
}

// Stats returns the volume stats collector: the last stats and health of
// every published volume, and per pod in the kubelet's summary API types.
// Nil when stats are disabled.
func (m *Manager) Stats() *stats.Collector { return m.stats }

// runChanges runs the change handlers until ctx ends.
func (m *Manager) runChanges(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { m.checker.Run(ctx) })
	wg.Go(func() { m.republisher.Run(ctx, 4) })
	if m.stats != nil {
		wg.Go(func() { m.stats.Run(ctx) })
	}
	wg.Wait()
}
