package lifecycle

import (
	"context"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/expand"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// newExpander builds the cluster mode's volume expansion: claims from the
// sources' caches, their status written through the client, and told of
// every change of a pod's objects and of the desired volumes.
func newExpander(m *Manager, src *source.Source, events *status.Events, queues status.QueueOptions) (*expand.Expander, error) {
	exp, err := expand.New(expand.Config{
		Claims: src, Client: m.cfg.Client, Desired: m.desire, Actual: m.world,
		Operations: lateOperations{m}, Events: events, NodeName: m.cfg.NodeName,
		RetryBaseDelay: m.cfg.Reconciler.RetryBaseDelay, RetryMaxDelay: m.cfg.Reconciler.RetryMaxDelay,
		MetricsProvider: queues.MetricsProvider, Gate: m.owner,
	})
	if err != nil {
		return nil, err
	}
	src.OnPodChange(exp.PodChanged)
	m.desire.Subscribe(dsw.Handler{Volume: exp.VolumeChanged})
	return exp, nil
}

// lateOperations reaches the Manager's operations, which are built after
// the mode's inputs.
type lateOperations struct{ m *Manager }

func (l lateOperations) Expand(ctx context.Context, key volume.PodKey, src volume.Source, requiredBytes int64) (int64, error) {
	return l.m.ops.Expand(ctx, key, src, requiredBytes)
}

func (l lateOperations) MarkMountUncertain(ctx context.Context, key volume.PodKey, step volume.Step, err error) error {
	return l.m.ops.MarkMountUncertain(ctx, key, step, err)
}
