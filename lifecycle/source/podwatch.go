package source

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// watchHealth records whether the pod informer's last list or watch call
// succeeded, for the liveness check: a pod informer whose calls have failed
// for longer than a bound no longer hears of pods. It sees every call, also
// those the reflector retries by itself without telling its watch error
// handler (a refused connection is retried as a watch, not a relist).
type watchHealth struct {
	now func() time.Time

	mu sync.Mutex
	// since is when the calls started failing (zero while the last call
	// succeeded); lastErr is the latest failure.
	since   time.Time
	lastErr error
}

// observe records the outcome of one list or watch call.
func (h *watchHealth) observe(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.since, h.lastErr = time.Time{}, nil
		return
	}
	if h.since.IsZero() {
		h.since = h.now()
	}
	h.lastErr = err
}

// check fails when the calls have failed, without one that succeeded, for
// longer than bound.
func (h *watchHealth) check(bound time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() {
		return nil
	}
	if failing := h.now().Sub(h.since); failing > bound {
		return fmt.Errorf("listing and watching the node's pods has failed for %v (longer than %v): %w",
			failing.Round(time.Second), bound, h.lastErr)
	}
	return nil
}

// newPodInformer is the pod informer of the factory's defaults (namespace
// index, the factory's list options and transform), its list and watch
// calls observed by health.
func newPodInformer(client kubernetes.Interface, tweak func(*metav1.ListOptions), health *watchHealth) cache.SharedIndexInformer {
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			tweak(&opts)
			list, err := pods.List(ctx, opts)
			health.observe(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			tweak(&opts)
			w, err := pods.Watch(ctx, opts)
			health.observe(err)
			return w, err
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{},
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
}

// CheckPodWatch is the liveness check of the pod informer: it fails when
// listing and watching the node's pods has failed, without a call that
// succeeded, for longer than bound (an API server that stays unreachable,
// credentials that no longer work).
func (s *Source) CheckPodWatch(bound time.Duration) error { return s.podWatch.check(bound) }
