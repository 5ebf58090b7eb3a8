package mountcheck

import (
	"context"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Observe wraps the reconciler's operations so that the checker learns of
// every successful stage and publish (the baseline of the next check, and
// the end of a repair) and of every unpublish and unstage (what it knew of
// the paths is dropped).
func (c *Checker) Observe(ops reconciler.Operations) reconciler.Operations {
	return observed{Operations: ops, c: c}
}

type observed struct {
	reconciler.Operations
	c *Checker
}

func (o observed) Stage(ctx context.Context, name volume.Name, src volume.Source, fsGroup *int64) error {
	err := o.Operations.Stage(ctx, name, src, fsGroup)
	if err == nil {
		o.c.staged(name)
	}
	return err
}

func (o observed) Publish(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) error {
	err := o.Operations.Publish(ctx, key, src, pv)
	if err == nil {
		o.c.published(ctx, key, src, pv)
	}
	return err
}

func (o observed) Unpublish(ctx context.Context, key volume.PodKey) error {
	p, _ := o.c.cfg.State.Pod(key)
	err := o.Operations.Unpublish(ctx, key)
	if err == nil {
		o.c.forget(key, p.TargetPath)
	}
	return err
}

func (o observed) Unstage(ctx context.Context, name volume.Name) error {
	v, _ := o.c.cfg.State.Volume(name)
	err := o.Operations.Unstage(ctx, name)
	if err == nil {
		o.c.forgetPath(v.StagingPath)
	}
	return err
}
