package reconciler

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Queue names, as they appear in the workqueue metrics.
const (
	VolumeQueueName = "csi_volmgr_volumes"
	PodQueueName    = "csi_volmgr_pod_volumes"
)

// DefaultShutdownGrace is how long steps in flight may run on after the
// agent was told to stop (SIGTERM); a supervisor's stop timeout (the
// systemd unit's TimeoutStopSec, a pod's terminationGracePeriodSeconds)
// must exceed it.
const DefaultShutdownGrace = 30 * time.Second

// Config configures a Reconciler.
type Config struct {
	Desired    DesiredState
	Actual     ActualState
	Operations Operations
	Policies   Policies
	Drivers    Drivers
	// Synced is closed once the desired state has seen every pod (the
	// populator's Synced). Nothing is torn down before.
	Synced <-chan struct{}
	// Settled, when set, tells whether the desired state has resolved
	// every pod event so far (the populator's Settled). A volume that looks
	// unwanted is not unstaged while it is false: a pod not resolved yet
	// may want it.
	Settled func() bool
	// Status, Events, InUse and Ready are optional outputs.
	Status StatusWriter
	Events EventRecorder
	InUse  InUseReporter
	Ready  ReadyObserver
	// Gate, when set, holds back every step while the agent does not own
	// its Node: a worker waits on it before each key, so no stage,
	// publish, unpublish or unstage starts until it opens. Steps in
	// flight finish; nothing is torn down because it closed.
	Gate Gate
	// Expander, when set, expands a volume right after its publish when
	// its claim was resized before the mount.
	Expander MountExpander
	// Health, when set, names unhealthy volumes in ready pods' conditions.
	Health VolumeHealth
	// Holds, when set (a runtime beside the agent), keeps the volumes of
	// pods that left the desired state until their runtime released them:
	// a held pod's volume is not unpublished, and so not unstaged. Call
	// PodReleased when a pod is released.
	Holds RuntimeHolds
	// VolumeWorkers and PodWorkers are the numbers of keys handled at once;
	// 0 means 8 and 32.
	VolumeWorkers, PodWorkers int
	// ResyncPeriod is how often every key is enqueued again; 0 means 5m.
	ResyncPeriod time.Duration
	// RetryBaseDelay and RetryMaxDelay bound the per-key backoff; 0 means
	// the kubelet's 500ms and 2m2s.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// MetricsProvider names the queues' metrics; nil uses client-go's global provider.
	MetricsProvider workqueue.MetricsProvider
	// Now is the clock for the pod-ready latency; nil means time.Now.
	Now func() time.Time
	// ShutdownGrace bounds how long steps in flight may run on after Run's
	// context ends; 0 means DefaultShutdownGrace. No new step starts after
	// the context ends.
	ShutdownGrace time.Duration

	// processed, when set (tests), is told every key handled, with its error.
	processed func(key any, err error)
}

func (c *Config) validate() error {
	var errs []error
	if c.Desired == nil || c.Actual == nil || c.Operations == nil || c.Policies == nil || c.Drivers == nil || c.Synced == nil {
		errs = append(errs, errors.New("reconciler: Desired, Actual, Operations, Policies, Drivers and Synced are required"))
	}
	if c.VolumeWorkers == 0 {
		c.VolumeWorkers = 8
	}
	if c.PodWorkers == 0 {
		c.PodWorkers = 32
	}
	if c.ResyncPeriod == 0 {
		c.ResyncPeriod = 5 * time.Minute
	}
	if c.RetryBaseDelay == 0 {
		c.RetryBaseDelay = 500 * time.Millisecond
	}
	if c.RetryMaxDelay == 0 {
		c.RetryMaxDelay = 2*time.Minute + 2*time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	return errors.Join(errs...)
}

// Reconciler runs the lifecycle steps; see the package documentation.
type Reconciler struct {
	cfg     Config
	volumes workqueue.TypedRateLimitingInterface[volume.Name]
	pods    workqueue.TypedRateLimitingInterface[volume.PodKey]
	// inUseDirty wakes the goroutine that recomputes volumesInUse.
	inUseDirty chan struct{}

	// statusMu serializes the computation and hand-over of pod statuses,
	// and protects unreadable.
	statusMu sync.Mutex
	// unreadable holds, per pod, the message of the last Event recorded
	// for a volume whose objects cannot be read (volume.ErrUnreadable),
	// so that the retries of its resolution record one Event per reason.
	unreadable map[types.UID]string
	// mu protects ready.
	mu sync.Mutex
	// ready holds the pods whose volumes were all published when last
	// checked, so the ready latency is observed once per pod.
	ready map[types.UID]bool
	// steps are the steps the workers are inside (CheckSteps).
	steps steps
}

// New returns a Reconciler. Subscribe DesiredStateHandler to the desired
// state and have the event sources call DriverRegistered, PolicyChanged,
// AttachmentChanged and Reported; then Run.
func New(cfg Config) (*Reconciler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Reconciler{
		cfg:        cfg,
		inUseDirty: make(chan struct{}, 1),
		ready:      map[types.UID]bool{},
		unreadable: map[types.UID]string{},
	}
	// Each operation's return is progress of the step that ran it.
	r.cfg.Operations = progressOps{Operations: cfg.Operations, steps: &r.steps, now: cfg.Now}
	r.volumes = workqueue.NewTypedRateLimitingQueueWithConfig(newLimiter[volume.Name](cfg),
		workqueue.TypedRateLimitingQueueConfig[volume.Name]{Name: VolumeQueueName, MetricsProvider: cfg.MetricsProvider})
	r.pods = workqueue.NewTypedRateLimitingQueueWithConfig(newLimiter[volume.PodKey](cfg),
		workqueue.TypedRateLimitingQueueConfig[volume.PodKey]{Name: PodQueueName, MetricsProvider: cfg.MetricsProvider})
	return r, nil
}

// newLimiter is the kubelet's per-key exponential backoff, combined with a
// bucket that keeps a storm of failures from spinning.
func newLimiter[T comparable](cfg Config) workqueue.TypedRateLimiter[T] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[T](cfg.RetryBaseDelay, cfg.RetryMaxDelay),
		&workqueue.TypedBucketRateLimiter[T]{Limiter: newBucket()},
	)
}

// newBucket limits retries over all keys to 50/s with bursts of 500, as
// client-go's default controller rate limiter does (10/s, 100) scaled to the
// many small keys of a node.
func newBucket() *rate.Limiter { return rate.NewLimiter(rate.Limit(50), 500) }

// DesiredStateHandler is the dsw.Handler that feeds the queues; subscribe
// it to the desired state before the populator starts.
func (r *Reconciler) DesiredStateHandler() dsw.Handler {
	return dsw.Handler{
		Volume:    func(name volume.Name) { r.volumes.Add(name); r.markInUseDirty() },
		PodVolume: func(key volume.PodKey) { r.pods.Add(key) },
		Pod:       r.podChanged,
	}
}

// DriverRegistered resets the backoff of, and enqueues, every volume of a
// driver that registered or re-registered, so that work waiting for it
// starts now instead of at the end of a backoff of up to two minutes.
func (r *Reconciler) DriverRegistered(driver string) { r.wakeDriver(driver) }

// PolicyChanged does the same for a driver whose CSIDriver policy changed
// (created, updated or deleted): e.g. attachRequired turning false frees
// volumes that wait for a VolumeAttachment. The desired state does not
// change with a policy, so nothing else wakes them. Whether the driver's
// volumes belong in volumesInUse may have changed too.
func (r *Reconciler) PolicyChanged(driver string) {
	r.markInUseDirty()
	r.wakeDriver(driver)
}

// wakeDriver resets the backoff of, and enqueues, every volume of driver
// and its pods.
func (r *Reconciler) wakeDriver(driver string) {
	for _, name := range r.knownVolumes() {
		if r.driverOf(name) != driver {
			continue
		}
		r.volumes.Forget(name)
		r.volumes.Add(name)
		for _, key := range r.podKeysOf(name) {
			r.pods.Forget(key)
			r.pods.Add(key)
		}
	}
}

// PodReleased enqueues the teardown of a pod's publishes (keys) that its
// runtime released (Config.Holds), resetting their backoff: a held key
// waits for no retry.
func (r *Reconciler) PodReleased(keys []volume.PodKey) {
	for _, key := range keys {
		r.pods.Forget(key)
		r.pods.Add(key)
	}
}

// AttachmentChanged enqueues a volume whose VolumeAttachment changed.
func (r *Reconciler) AttachmentChanged(name volume.Name) { r.volumes.Add(name) }

// Reported enqueues volumes that were just written to volumesInUse.
func (r *Reconciler) Reported(names []volume.Name) {
	for _, n := range names {
		r.volumes.Add(n)
	}
}

// Run works the queues until ctx ends. Then it starts no new step and lets
// the steps in flight finish, for at most ShutdownGrace, before it cancels
// them and returns. It never tears anything down because it stops.
func (r *Reconciler) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	// Steps run on workCtx, which outlives ctx by the grace period, so that
	// a shutdown does not turn every call in flight into an uncertain one.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	syncVolume, syncPodVolume := track(&r.steps, r.cfg.Now, r.syncVolume), track(&r.steps, r.cfg.Now, r.syncPodVolume)
	var workers sync.WaitGroup
	for range r.cfg.VolumeWorkers {
		workers.Go(func() {
			for processNext(ctx, workCtx, r.volumes, r.cfg.Gate, syncVolume, r.cfg.processed) {
			}
		})
	}
	for range r.cfg.PodWorkers {
		workers.Go(func() {
			for processNext(ctx, workCtx, r.pods, r.cfg.Gate, syncPodVolume, r.cfg.processed) {
			}
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() { r.reportInUse(ctx) })
	wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.Synced:
		}
		logger.Info("Desired state synced: teardown enabled")
		r.resync()
		ticker := time.NewTicker(r.cfg.ResyncPeriod)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				r.resync()
			}
		}
	})
	r.resync() // setup can start before sync; teardown waits
	<-ctx.Done()
	r.volumes.ShutDown()
	r.pods.ShutDown()
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(r.cfg.ShutdownGrace):
		logger.Info("Steps still in flight after the shutdown grace period; cancelling them", "grace", r.cfg.ShutdownGrace)
		cancelWork()
		<-done
	}
	wg.Wait()
}

// resync enqueues every key the desired or actual state knows: teardown
// keys first, so that unmounts go before mounts.
func (r *Reconciler) resync() {
	var setup []volume.PodKey
	for _, name := range r.knownVolumes() {
		for _, key := range r.podKeysOf(name) {
			if _, wanted := r.cfg.Desired.PodVolume(key); wanted {
				setup = append(setup, key)
				continue
			}
			r.pods.Add(key)
		}
		if _, wanted := r.cfg.Desired.Volume(name); !wanted {
			r.volumes.Add(name)
		}
	}
	for _, name := range r.cfg.Desired.Volumes() {
		r.volumes.Add(name)
	}
	for _, key := range setup {
		r.pods.Add(key)
	}
	r.markInUseDirty()
}

func (r *Reconciler) synced() bool {
	select {
	case <-r.cfg.Synced:
		return true
	default:
		return false
	}
}

// processNext handles one key on workCtx: Forget on success,
// AddRateLimited on error. Once ctx has ended it takes no new key. With a
// gate, it holds the key until the gate opens (the queue keeps later adds
// of the key for after Done); the end of ctx ends the wait, so a closed
// gate never holds up a shutdown.
func processNext[T comparable](ctx, workCtx context.Context, q workqueue.TypedRateLimitingInterface[T], gate Gate, sync func(context.Context, T) error, processed func(any, error)) bool {
	key, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(key)
	if gate != nil && gate.Wait(ctx) != nil {
		return false
	}
	if ctx.Err() != nil {
		return false
	}
	err := sync(workCtx, key)
	if processed != nil {
		defer processed(key, err)
	}
	if err != nil && workCtx.Err() == nil {
		klog.FromContext(ctx).V(2).Info("Lifecycle step failed; will retry with backoff", "key", key, "err", err)
		q.AddRateLimited(key)
		return true
	}
	q.Forget(key)
	return true
}
