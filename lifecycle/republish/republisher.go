// Package republish publishes again, on a period, the volumes of drivers
// whose CSIDriver has requiresRepublish (the kubelet's remount of such
// volumes at every pod sync), so that such drivers can rotate what they
// mounted (secrets-store-csi-driver) and get fresh service account tokens.
package republish

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// QueueName names the republish queue in the workqueue metrics.
const QueueName = "csi_volmgr_republish"

// DefaultPeriod is the kubelet's pod sync period, at which it remounts the
// volumes of requiresRepublish drivers.
const DefaultPeriod = time.Minute

// tokenShare is the share of a token's lifetime the period is at most:
// tokens are refreshed in the last fifth of their lifetime (the kubelet's
// rule), so republishing every tenth delivers each fresh token at least
// once before the old one expires.
const tokenShare = 10

// Operations publishes; the reconciler's operations implement it.
type Operations interface {
	Publish(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) error
}

// ActualState is what the republisher reads of the actual state;
// *asw.World implements it.
type ActualState interface {
	Snapshot() []asw.VolumeStatus
	Pod(key volume.PodKey) (asw.Pod, bool)
}

// DesiredState gives the pods' uses; *dsw.Store implements it.
type DesiredState interface {
	PodVolume(key volume.PodKey) (dsw.Use, bool)
}

// Policies gives the drivers' CSIDriver policies.
type Policies interface {
	Get(driver string) volume.Policy
}

// Events records Events on pods; *status.Events implements it.
type Events interface {
	Pod(pod volume.PodInfo, eventType, reason, message string)
}

// Config configures a Republisher; every field but Events, Period, Synced
// and the backoff is required.
type Config struct {
	Desired    DesiredState
	Actual     ActualState
	Policies   Policies
	Operations Operations
	Events     Events
	// Period is how often each volume is published again; 0 means
	// DefaultPeriod. A driver's tokenRequests shorten it to a tenth of
	// their shortest lifetime.
	Period time.Duration
	// Synced delays the first republish until the desired state synced.
	Synced <-chan struct{}
	// RetryBaseDelay and RetryMaxDelay bound the backoff of a failed
	// republish; 0 means 500ms and 2m2s.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// MetricsProvider names the queue's metrics.
	MetricsProvider workqueue.MetricsProvider
}

// Republisher calls NodePublishVolume again for every published use of a
// volume whose driver has requiresRepublish, once per period: with fresh
// tokens when the driver asks for tokens (the operations' token source
// refreshes them by the kubelet's rules), never unmounting anything. A
// failed republish keeps the mount (the publish stays Published), records
// the kubelet's FailedMount Event on the pod and is retried with backoff.
type Republisher struct {
	cfg   Config
	queue workqueue.TypedRateLimitingInterface[volume.PodKey]

	// mu guards last.
	mu sync.Mutex
	// last is when each use was last published by the republisher.
	last map[volume.PodKey]time.Time
}

// New returns a Republisher; Run starts it.
func New(cfg Config) (*Republisher, error) {
	if cfg.Desired == nil || cfg.Actual == nil || cfg.Policies == nil || cfg.Operations == nil {
		return nil, errors.New("republish: Desired, Actual, Policies and Operations are required")
	}
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.RetryBaseDelay == 0 {
		cfg.RetryBaseDelay = 500 * time.Millisecond
	}
	if cfg.RetryMaxDelay == 0 {
		cfg.RetryMaxDelay = 2*time.Minute + 2*time.Second
	}
	return &Republisher{
		cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[volume.PodKey](cfg.RetryBaseDelay, cfg.RetryMaxDelay),
			workqueue.TypedRateLimitingQueueConfig[volume.PodKey]{Name: QueueName, MetricsProvider: cfg.MetricsProvider}),
		last: map[volume.PodKey]time.Time{},
	}, nil
}

// PeriodOf is how often a driver's volumes are published again: the
// configured period, or a tenth of the shortest lifetime of the tokens its
// CSIDriver asks for when that is shorter (a request without
// expirationSeconds gets the API server's default of one hour).
func PeriodOf(p volume.Policy, period time.Duration) time.Duration {
	for _, tr := range p.TokenRequests {
		ttl := time.Hour
		if tr.ExpirationSeconds != nil {
			ttl = time.Duration(*tr.ExpirationSeconds) * time.Second
		}
		period = min(period, ttl/tokenShare)
	}
	return max(period, time.Second)
}

// Run republishes until ctx ends, with workers goroutines.
func (r *Republisher) Run(ctx context.Context, workers int) {
	logger := klog.FromContext(ctx).WithName("republish")
	ctx = klog.NewContext(ctx, logger)
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	if r.cfg.Synced != nil {
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.Synced:
		}
	}
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for r.processNext(ctx) {
			}
		})
	}
	// Due uses are found by a scan at a fraction of the period; each use is
	// republished when its own period has passed.
	scan := max(r.cfg.Period/4, 250*time.Millisecond)
	t := time.NewTicker(scan)
	defer t.Stop()
	for {
		r.enqueueDue(time.Now())
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
		}
	}
}

// enqueueDue enqueues every published use of a requiresRepublish driver
// whose period has passed since its last (re)publish by the republisher,
// and forgets the uses that are gone.
func (r *Republisher) enqueueDue(now time.Time) {
	periods := map[string]time.Duration{}
	seen := map[volume.PodKey]bool{}
	for _, v := range r.cfg.Actual.Snapshot() {
		if v.External {
			continue
		}
		period, ok := periods[v.Driver]
		if !ok {
			period = -1
			if p := r.cfg.Policies.Get(v.Driver); p.RequiresRepublish {
				period = PeriodOf(p, r.cfg.Period)
			}
			periods[v.Driver] = period
		}
		if period < 0 {
			continue
		}
		for _, p := range v.Pods {
			if p.State != volume.Published || p.External {
				continue
			}
			seen[p.Key] = true
			r.mu.Lock()
			last, known := r.last[p.Key]
			if !known {
				// Published just now by the reconciler: due in a period.
				r.last[p.Key] = now
			}
			r.mu.Unlock()
			if known && now.Sub(last) >= period {
				r.queue.Add(p.Key)
			}
		}
	}
	r.mu.Lock()
	for key := range r.last {
		if !seen[key] {
			delete(r.last, key)
		}
	}
	r.mu.Unlock()
}

func (r *Republisher) processNext(ctx context.Context) bool {
	key, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(key)
	if err := r.republish(ctx, key); err != nil {
		if ctx.Err() == nil {
			r.queue.AddRateLimited(key)
		}
		return true
	}
	r.queue.Forget(key)
	return true
}

// republish publishes one use again if it is still wanted and published.
func (r *Republisher) republish(ctx context.Context, key volume.PodKey) error {
	use, wanted := r.cfg.Desired.PodVolume(key)
	if p, ok := r.cfg.Actual.Pod(key); !wanted || !ok || p.State != volume.Published || p.External {
		return nil
	}
	if !r.cfg.Policies.Get(use.Source.Driver).RequiresRepublish {
		return nil
	}
	err := r.cfg.Operations.Publish(ctx, key, use.Source, use.Volume)
	logger := klog.FromContext(ctx).WithValues("volume", key.Volume, "podUID", key.Pod)
	if errors.Is(err, volume.ErrNotWanted) {
		// The pod left while the republish waited for its lock (behind
		// the reconciler's unpublish): nothing was called.
		r.mu.Lock()
		delete(r.last, key)
		r.mu.Unlock()
		logger.V(2).Info("Pod no longer wants the volume; not republished")
		return nil
	}
	r.mu.Lock()
	r.last[key] = time.Now()
	r.mu.Unlock()
	if err != nil {
		logger.Info("Republishing the volume failed; the mount is kept, will retry with backoff", "err", err)
		if r.cfg.Events != nil {
			r.cfg.Events.Pod(use.Volume.Pod, corev1.EventTypeWarning, eventFailedMount,
				fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v", name(use), err))
		}
		return err
	}
	logger.V(4).Info("Republished volume")
	return nil
}

// eventFailedMount is the kubelet's reason for a failed (re)mount.
const eventFailedMount = "FailedMount"

func name(u dsw.Use) string {
	if u.Source.PVName != "" {
		return u.Source.PVName
	}
	return u.Volume.SpecName
}

// mapSizes counts the entries of the republisher's map and queue; for tests
// that check that they do not grow with the pods seen.
func (r *Republisher) mapSizes() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return map[string]int{"last": len(r.last), "queue": r.queue.Len()}
}
