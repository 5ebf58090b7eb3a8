package reconciler

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// steps tracks the steps the workers are inside, for the liveness check:
// a worker that stays inside one step far longer than its CSI calls may
// take is wedged (a hung mount(8) or stat(2) on a dead server, a lock never
// released), and no retry or backoff will free it.
type steps struct {
	mu     sync.Mutex
	next   uint64
	active map[uint64]*step
}

// step is one step in flight: its key, when it started and when it last
// reported progress (a long fsGroup ownership change reports every few
// seconds and is not wedged).
type step struct {
	key      any
	started  time.Time
	progress time.Time
}

// track wraps sync so that every call is recorded while it runs. The
// step's context carries its id, so that each operation it runs counts as
// progress when it returns (progressOps).
func track[T comparable](s *steps, now func() time.Time, sync func(context.Context, T) error) func(context.Context, T) error {
	return func(ctx context.Context, key T) error {
		id := s.begin(key, now())
		defer s.end(id)
		return sync(context.WithValue(ctx, stepID{}, id), key)
	}
}

// stepID is the context key of the step's id.
type stepID struct{}

// progressOps marks the step progressed each time one of its operations
// returns: the liveness bound applies to one operation (its lock wait and
// its CSI call), not to a step that runs several of them (a publish and
// the expansion after it, an unstage and a stage).
type progressOps struct {
	Operations
	steps *steps
	now   func() time.Time
}

func (o progressOps) done(ctx context.Context) {
	if id, ok := ctx.Value(stepID{}).(uint64); ok {
		o.steps.progressedID(id, o.now())
	}
}

func (o progressOps) WaitForAttach(ctx context.Context, name volume.Name, src volume.Source) error {
	defer o.done(ctx)
	return o.Operations.WaitForAttach(ctx, name, src)
}

func (o progressOps) Stage(ctx context.Context, name volume.Name, src volume.Source, fsGroup *int64) error {
	defer o.done(ctx)
	return o.Operations.Stage(ctx, name, src, fsGroup)
}

func (o progressOps) Publish(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) error {
	defer o.done(ctx)
	return o.Operations.Publish(ctx, key, src, pv)
}

func (o progressOps) Unpublish(ctx context.Context, key volume.PodKey) error {
	defer o.done(ctx)
	return o.Operations.Unpublish(ctx, key)
}

func (o progressOps) Unstage(ctx context.Context, name volume.Name) error {
	defer o.done(ctx)
	return o.Operations.Unstage(ctx, name)
}

func (s *steps) begin(key any, at time.Time) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active == nil {
		s.active = map[uint64]*step{}
	}
	s.next++
	s.active[s.next] = &step{key: key, started: at, progress: at}
	return s.next
}

func (s *steps) end(id uint64) {
	s.mu.Lock()
	delete(s.active, id)
	s.mu.Unlock()
}

// progressedID records progress of the step id.
func (s *steps) progressedID(id uint64, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.active[id]; ok {
		st.progress = at
	}
}

// progressed records progress of the steps of key.
func (s *steps) progressed(key any, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.active {
		if st.key == key {
			st.progress = at
		}
	}
}

// count returns the number of steps in flight.
func (s *steps) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}

// stalest returns the step whose last progress is the oldest.
func (s *steps) stalest() (step, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		out   step
		found bool
	)
	for _, st := range s.active {
		if !found || st.progress.Before(out.progress) {
			out, found = *st, true
		}
	}
	return out, found
}

// StepProgressed records that the step of a pod's volume made progress
// (operations.Config.OnProgress): it is long, not wedged.
func (r *Reconciler) StepProgressed(key volume.PodKey) { r.steps.progressed(key, r.cfg.Now()) }

// CheckSteps is the liveness check of the workers: it fails when a worker
// has been inside one step, without progress, for longer than bound. The
// error names the step and how long it has run.
func (r *Reconciler) CheckSteps(bound time.Duration) error {
	st, ok := r.steps.stalest()
	if !ok {
		return nil
	}
	now := r.cfg.Now()
	if stalled := now.Sub(st.progress); stalled > bound {
		return fmt.Errorf("a lifecycle worker is inside the step of %v for %v without progress (started %v ago), longer than %v",
			st.key, stalled.Round(time.Second), now.Sub(st.started).Round(time.Second), bound)
	}
	return nil
}
