package source

import (
	"errors"
	"testing"
	"time"
)

// TestPodWatchHealth: calls that fail without one that succeeds fail the
// check once they have failed for longer than the bound; one call that
// succeeds ends the run of failures.
func TestPodWatchHealth(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	h := &watchHealth{now: func() time.Time { return now }}
	refused := errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	const bound = 5 * time.Minute

	if err := h.check(bound); err != nil {
		t.Fatalf("no call yet: %v", err)
	}
	start := now
	for now.Sub(start) <= bound {
		h.observe(refused)
		if err := h.check(bound); err != nil {
			t.Fatalf("failing for %v, within the bound: %v", now.Sub(start), err)
		}
		now = now.Add(55 * time.Second)
	}
	err := h.check(bound)
	if err == nil || !errors.Is(err, refused) {
		t.Fatalf("failing for %v: check %v, want the last error", now.Sub(start), err)
	}

	h.observe(nil)
	if err := h.check(bound); err != nil {
		t.Fatalf("after a call that succeeded: %v", err)
	}
	now = now.Add(time.Hour)
	h.observe(refused)
	if err := h.check(bound); err != nil {
		t.Fatalf("one failure after an hour of success: %v", err)
	}
}
