package source

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"
)

// The pod cache can fall behind the API server: while its watch is broken
// (an API server outage, then the reflector's backoff before it watches and
// lists again: seconds, up to half a minute, and client-go tells nobody) a
// pod created meanwhile is not in the cache, and a volume only it wants
// looks unwanted (a chaos run's finding: a volume unstaged under a pod
// created 6 s earlier, right after an outage). So before a volume is
// unstaged the cache is checked against a consistent LIST of the node's
// pods, and only when the reconciler is about to unstage.
//
// The check never holds its caller: every volume waiting to be unstaged
// asks again every 100 ms, from a volume worker, and during an API server
// outage a LIST that waits for its timeout held each of those workers in
// turn (issue 23, 4: with 8 unstages pending, every volume worker waited
// there and the stages of unrelated volumes stalled, while the failed
// LISTs used up the client's QPS). So a caller gets the answer known now,
// and a check starts in the background if none is in flight and the last
// failure's backoff has passed: one LIST at a time for the whole node,
// failures spaced out exponentially up to freshMaxBackoff. The caller asks
// again later: the reconciler retries the unstage shortly.

// freshWindow is how long a check that found the cache complete answers
// for: a pod created since then reaches the cache through a working watch
// within milliseconds; a watch that broke since then is caught by the next
// check.
const freshWindow = 500 * time.Millisecond

// freshTimeout bounds one check.
const freshTimeout = 5 * time.Second

// freshBaseBackoff and freshMaxBackoff space out the checks after a check
// that failed or found the cache behind: doubled after each, capped.
const (
	freshBaseBackoff = 200 * time.Millisecond
	freshMaxBackoff  = 5 * time.Second
)

// podsFreshness remembers the last check of the pod cache and runs the
// next one.
type podsFreshness struct {
	mu sync.Mutex
	// checked is when the last check that found the cache complete began.
	checked time.Time
	// running is set while a check is in flight.
	running bool
	// retryAt is when the next check may begin, after failures; backoff is
	// the wait after the next failure.
	retryAt time.Time
	backoff time.Duration
	// ctx is the Source's run context: a check ends with it. Before Run,
	// checks run with freshTimeout only.
	ctx context.Context
	// stopped is set once Run ended: no check starts any more.
	stopped bool
	// wg counts checks in flight, for Run to wait for.
	wg sync.WaitGroup
}

// PodsCurrent tells whether the pod cache holds every pod the API server
// has on the node, as a consistent LIST that began less than freshWindow
// ago found. It never waits for the API server: when no such LIST is
// known it starts one in the background (unless one is in flight, or the
// backoff after a failed one has not passed) and returns false, "not known
// to be current"; ask again later. An error, an API
// server that is down, or a pod the cache lacks is false. The populator
// calls the desired state settled only when it is true.
func (s *Source) PodsCurrent(ctx context.Context) bool {
	f := s.fresh
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if now.Sub(f.checked) < freshWindow {
		return true
	}
	if f.running || f.stopped || now.Before(f.retryAt) {
		return false
	}
	f.running = true
	runCtx := f.ctx
	if runCtx == nil {
		runCtx = context.WithoutCancel(ctx)
	}
	logger := klog.FromContext(ctx)
	f.wg.Go(func() { s.checkPods(klog.NewContext(runCtx, logger), now) })
	return false
}

// checkPods makes one check that began at began and records its result.
func (s *Source) checkPods(ctx context.Context, began time.Time) {
	missing, err := s.missingPods(ctx)
	logger := klog.FromContext(ctx)
	f := s.fresh
	f.mu.Lock()
	f.running = false
	switch {
	case err != nil || missing > 0:
		f.backoff = min(max(2*f.backoff, freshBaseBackoff), freshMaxBackoff)
		f.retryAt = time.Now().Add(f.backoff)
		if err != nil {
			logger.V(4).Info("Checking the pod cache against the API server failed", "err", err, "retryIn", f.backoff)
		} else {
			logger.V(2).Info("The pod cache is behind the API server", "missingPods", missing, "retryIn", f.backoff)
		}
	default:
		f.checked, f.backoff, f.retryAt = began, 0, time.Time{}
	}
	f.mu.Unlock()
}

// runFreshness gives the checks the Source's run context, and waits for
// the check in flight when it ends.
func (s *Source) runFreshness(ctx context.Context) {
	s.fresh.mu.Lock()
	s.fresh.ctx = ctx
	s.fresh.mu.Unlock()
	<-ctx.Done()
	s.fresh.mu.Lock()
	s.fresh.stopped = true
	s.fresh.mu.Unlock()
	s.fresh.wg.Wait()
}

// missingPods lists the node's pods from the API server (a consistent
// read) and counts those the cache does not have.
func (s *Source) missingPods(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, freshTimeout)
	defer cancel()
	list, err := s.cfg.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String(),
	})
	if err != nil {
		return 0, err
	}
	missing := 0
	for i := range list.Items {
		pod := &list.Items[i]
		if !s.ours(pod) {
			continue
		}
		if cached, ok := s.PodByName(pod.Namespace, pod.Name); !ok || cached.UID != pod.UID {
			missing++
		}
	}
	return missing, nil
}
