package source

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// TestPodWatchHealth: failures without a break past the bound fail the
// check; watches closed normally or expired are no failures; a silence
// longer than the reflector's longest retry pause ends a run of failures.
func TestPodWatchHealth(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	h := &watchHealth{now: func() time.Time { return now }}
	r := cache.NewReflector(nil, nil, nil, 0)
	ctx := context.Background()
	refused := errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	const bound = 5 * time.Minute

	for range 20 {
		h.failed(ctx, r, io.EOF)
		h.failed(ctx, r, apierrors.NewResourceExpired("too old"))
		h.failed(ctx, r, apierrors.NewGone("gone"))
		now = now.Add(30 * time.Second)
	}
	if err := h.check(bound); err != nil {
		t.Fatalf("closed and expired watches for 10 minutes: %v", err)
	}

	start := now
	for now.Sub(start) < bound {
		h.failed(ctx, r, refused)
		if err := h.check(bound); err != nil {
			t.Fatalf("failing for %v, within the bound: %v", now.Sub(start), err)
		}
		now = now.Add(55 * time.Second)
	}
	h.failed(ctx, r, refused)
	err := h.check(bound)
	if err == nil || !errors.Is(err, refused) {
		t.Fatalf("failing for %v without a break: check %v, want the last error", now.Sub(start), err)
	}

	now = now.Add(watchRetryGap + time.Second)
	if err := h.check(bound); err != nil {
		t.Fatalf("silent for %v after the last failure: %v", watchRetryGap, err)
	}
	h.failed(ctx, r, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no")))
	if err := h.check(bound); err != nil {
		t.Fatalf("one failure after a silence starts a new run: %v", err)
	}
}
