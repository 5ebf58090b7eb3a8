package lifecycle

import (
	"context"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/mountcheck"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ChangesConfig tunes what the lifecycle does for volumes that change
// while in use: the mount check that repairs mounts broken by a driver's
// restart. The zero value is the default.
type ChangesConfig struct {
	// MountCheckPeriod, when positive, checks the mounts of
	// MountCheckDrivers every period, on top of every registration of a
	// driver (which always checks that driver's mounts).
	MountCheckPeriod time.Duration
	// MountCheckDrivers are the drivers MountCheckPeriod applies to; empty
	// means all.
	MountCheckDrivers []string
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
	return checker.Observe(steps), nil
}

// runChanges runs the change handlers until ctx ends.
func (m *Manager) runChanges(ctx context.Context) {
	m.checker.Run(ctx)
}
