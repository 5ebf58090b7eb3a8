package status

import (
	"context"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Default backoff of failed writes: as the kubelet's operations, 500 ms
// doubling up to 2m2s per key, and overall at most 10 retries per second
// with bursts of 100 (client-go's default controller rate limiter).
const (
	defaultBaseDelay = 500 * time.Millisecond
	defaultMaxDelay  = 2*time.Minute + 2*time.Second
)

// QueueOptions tune a writer's workqueue. The zero value is the default.
type QueueOptions struct {
	// RateLimiter delays retries of failed writes; nil is the max of a
	// per-key exponential backoff (500 ms doubling to 2m2s) and a token
	// bucket (10/s, burst 100).
	RateLimiter workqueue.TypedRateLimiter[string]
	// MetricsProvider receives the queue's metrics (depth, adds, latency,
	// work duration, retries) under the queue's name; nil means the
	// provider set with workqueue.SetProvider.
	MetricsProvider workqueue.MetricsProvider
	// Clock times delayed adds (retries, held-back statuses); nil is the
	// real clock.
	Clock clock.WithTicker
}

// newQueue returns a rate-limited workqueue named name.
func newQueue(name string, opts QueueOptions) workqueue.TypedRateLimitingInterface[string] {
	rl := opts.RateLimiter
	if rl == nil {
		rl = workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](defaultBaseDelay, defaultMaxDelay),
			&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
		)
	}
	return workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[string]{
		Name:            name,
		MetricsProvider: opts.MetricsProvider,
		Clock:           opts.Clock,
	})
}

// Gate tells the writers when they may write: while the agent owns its
// Node; *nodeowner.Gate implements it.
type Gate interface {
	// Wait returns nil once writes may go out, or ctx's error when ctx
	// ends first.
	Wait(ctx context.Context) error
}

// runWorker processes keys of q with sync until q shuts down: Forget on
// success, AddRateLimited on error (the sample-controller pattern). With a
// gate, nothing is written while it is closed: the worker holds the key
// until it opens or ctx ends.
func runWorker(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], gate Gate,
	sync func(context.Context, string) error) {
	logger := klog.FromContext(ctx)
	for {
		key, shutdown := q.Get()
		if shutdown {
			return
		}
		func() {
			defer q.Done(key)
			if gate != nil && gate.Wait(ctx) != nil {
				return // shutting down
			}
			if err := sync(ctx, key); err != nil {
				if ctx.Err() != nil {
					return // shutting down; the write is abandoned
				}
				logger.Error(err, "Status write failed, will retry", "key", key, "retries", q.NumRequeues(key))
				q.AddRateLimited(key)
				return
			}
			q.Forget(key)
		}()
	}
}
