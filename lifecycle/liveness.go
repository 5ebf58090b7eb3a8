package lifecycle

import "time"

// CheckSteps fails when a reconciler worker has been inside one step,
// without progress, for longer than bound: the lifecycle is wedged (see
// reconciler.CheckSteps).
func (m *Manager) CheckSteps(bound time.Duration) error { return m.rec.CheckSteps(bound) }

// CheckPodWatch fails when the watch of the node's pods has failed without
// a break for longer than bound. Standalone mode has no watch to fail.
func (m *Manager) CheckPodWatch(bound time.Duration) error {
	if w, ok := m.mode.(podWatcher); ok {
		return w.checkPodWatch(bound)
	}
	return nil
}

// podWatcher is a mode whose pods come from a watch.
type podWatcher interface {
	checkPodWatch(bound time.Duration) error
}

func (c *clusterMode) checkPodWatch(bound time.Duration) error { return c.src.CheckPodWatch(bound) }
