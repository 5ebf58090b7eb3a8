package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
)

// watchRetryGap is longer than the longest pause of client-go's reflector
// between two failed list-and-watch attempts (a 30 s cap with a jitter of
// up to 100 %): errors closer together than this are one outage; a longer
// silence means the watch works again.
const watchRetryGap = 90 * time.Second

// watchHealth records the failures of the pod informer's list and watch,
// for the liveness check: a pod watch that has failed without a break for
// longer than a bound means the agent no longer hears of pods.
type watchHealth struct {
	now func() time.Time

	mu sync.Mutex
	// since is the first failure of the current run of failures, last
	// its latest, lastErr its error; since is zero without failures.
	since, last time.Time
	lastErr     error
}

// failed is the informer's watch error handler: it records err (a watch
// closed normally or expired is no failure) and then logs it as client-go
// does.
func (h *watchHealth) failed(ctx context.Context, r *cache.Reflector, err error) {
	if !errors.Is(err, io.EOF) && !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		now := h.now()
		h.mu.Lock()
		if h.since.IsZero() || now.Sub(h.last) > watchRetryGap {
			h.since = now
		}
		h.last, h.lastErr = now, err
		h.mu.Unlock()
	}
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

// check fails when the watch has failed, without a silence longer than
// watchRetryGap, for longer than bound.
func (h *watchHealth) check(bound time.Duration) error {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() || now.Sub(h.last) > watchRetryGap {
		return nil
	}
	if failing := now.Sub(h.since); failing > bound {
		return fmt.Errorf("the watch of the node's pods has failed for %v (longer than %v): %w",
			failing.Round(time.Second), bound, h.lastErr)
	}
	return nil
}

// CheckPodWatch is the liveness check of the pod informer: it fails when
// listing and watching the node's pods has failed without a break for
// longer than bound (an API server that stays unreachable, credentials that
// no longer work).
func (s *Source) CheckPodWatch(bound time.Duration) error { return s.podWatch.check(bound) }
