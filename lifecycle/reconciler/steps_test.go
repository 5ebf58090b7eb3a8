package reconciler

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// fakeNow is a clock the test moves.
type fakeNow struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeNow) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeNow) step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestCheckStepsFiresForAWedgedStep: a publish held inside the driver makes
// the liveness check fail once it has run, without progress, past the
// bound, naming the step; progress keeps it alive, and the check passes
// again once the step returns.
func TestCheckStepsFiresForAWedgedStep(t *testing.T) {
	clock := &fakeNow{now: time.Unix(1_000_000, 0)}
	h := newHarness(t, func(c *Config) { c.Now = clock.Now })
	src := pvSource("w1")
	name := volume.PersistentName(testDriver, "w1")
	key := volume.PodKey{Volume: name, Pod: "p1"}
	release := h.ops.setHold("publish " + key.String())
	defer release()
	h.setPod("p1", src)
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1")
	// Only the held publish in flight: the clock jumps below, and a step
	// that is merely slow under load would look wedged too.
	eventually(t, "only the publish in flight", func() bool { return h.r.steps.count() == 1 })

	const bound = 4 * time.Minute
	if err := h.r.CheckSteps(bound); err != nil {
		t.Fatalf("check at the start of the publish: %v", err)
	}
	clock.step(3 * time.Minute)
	h.r.StepProgressed(key)
	clock.step(3 * time.Minute)
	if err := h.r.CheckSteps(bound); err != nil {
		t.Fatalf("check 6 minutes into a publish that progressed 3 minutes ago: %v", err)
	}
	clock.step(2 * time.Minute)
	err := h.r.CheckSteps(bound)
	if err == nil {
		t.Fatal("check passed for a publish without progress for 5 minutes, bound 4")
	}
	if !strings.Contains(err.Error(), key.String()) {
		t.Errorf("check error %q does not name the step %s", err, key)
	}

	release()
	eventually(t, "pod ready", func() bool { s, _ := h.status.get("p1"); return s.Ready })
	eventually(t, "check passes once the step returned", func() bool { return h.r.CheckSteps(bound) == nil })
}

// TestEachOperationIsProgress: a step that runs several operations (an
// unpublish, then more) is judged by the time since its last operation
// returned, not since it started.
func TestEachOperationIsProgress(t *testing.T) {
	clock := &fakeNow{now: time.Unix(1_000_000, 0)}
	var s steps
	ops := progressOps{Operations: &fakeOps{world: asw.New(asw.Options{})}, steps: &s, now: clock.Now}
	key := volume.PodKey{Volume: "v", Pod: "p"}
	var stalled time.Duration
	step := track(&s, clock.Now, func(ctx context.Context, key volume.PodKey) error {
		clock.step(3 * time.Minute)
		if err := ops.Unpublish(ctx, key); err != nil {
			return err
		}
		clock.step(3 * time.Minute)
		st, _ := s.stalest()
		stalled = clock.Now().Sub(st.progress)
		return nil
	})
	if err := step(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	if stalled != 3*time.Minute {
		t.Errorf("6 minutes into a step whose operation returned after 3: stalled %v, want 3m", stalled)
	}
	if s.count() != 0 {
		t.Errorf("%d steps in flight after the step returned", s.count())
	}
}
