package mountcheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// QueueName names the check queue in the workqueue metrics.
const QueueName = "csi_volmgr_mount_check"

// ErrMountBroken is wrapped by the error recorded on a pod whose mount was
// found broken: the publish is being set up again.
var ErrMountBroken = operations.ErrMountBroken

// Reason values of a broken path, in logs, Events and errors.
const (
	reasonCorrupted  = "corrupted"
	reasonMissing    = "missing"
	reasonNotMounted = "not a mount point"
)

// ActualState is what the checker reads of the actual state; *asw.World
// implements it.
type ActualState interface {
	Snapshot() []asw.VolumeStatus
	Pod(key volume.PodKey) (asw.Pod, bool)
	Volume(name volume.Name) (asw.Volume, bool)
}

// DesiredState says which volumes and uses are still wanted; *dsw.Store
// implements it.
type DesiredState interface {
	Volume(name volume.Name) (volume.Source, bool)
	VolumePods(name volume.Name) []types.UID
	PodVolume(key volume.PodKey) (dsw.Use, bool)
}

// Operations repairs: Stage again (which, at a staging path that is a
// broken mount, unpublishes the volume's targets and unstages it first,
// leaving the targets' publishes uncertain), and marking a publish
// uncertain so that the reconciler publishes it again (Publish at a target
// that is a broken mount unpublishes it first); *operations.Operations
// implements it.
type Operations interface {
	Stage(ctx context.Context, name volume.Name, src volume.Source, fsGroup *int64) error
	MarkMountUncertain(ctx context.Context, key volume.PodKey, step volume.Step, err error) error
}

// Mounts inspects the mount table; mount.Interface implements it.
type Mounts interface {
	IsMountPoint(file string) (bool, error)
}

// Events records Events on pods; *status.Events implements it.
type Events interface {
	Pod(pod volume.PodInfo, eventType, reason, message string)
}

// Config configures a Checker. State, Desired, Operations and Requeue are
// required.
type Config struct {
	State      ActualState
	Desired    DesiredState
	Operations Operations
	// Requeue hands a pod's use whose publish was marked uncertain to the
	// reconciler, which publishes it again with its backoff.
	Requeue func(key volume.PodKey)
	// Synced is closed once the desired state has seen every pod: checks
	// wait for it, so that no wanted use is taken for a stale one.
	Synced <-chan struct{}
	// Mounts inspects the mount table; nil means mount.New("").
	Mounts Mounts
	// Events, when set, receives the recovery Events.
	Events Events
	// Registerer receives the checker's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Period, when positive, checks the mounts of Drivers every Period, on
	// top of every registration of a driver; 0 checks on registration only.
	Period time.Duration
	// Drivers are the drivers checked every Period; empty means all.
	Drivers []string
	// ProbeTimeout bounds one path's probe (a stat of a hung network mount
	// can block): the path is then left alone. 0 means 10s.
	ProbeTimeout time.Duration
	// Concurrency bounds how many paths are probed at once; 0 means 8.
	Concurrency int
	// RetryBaseDelay and RetryMaxDelay bound a driver's check backoff after
	// a repair failed; 0 means 500ms and 2m2s.
	RetryBaseDelay, RetryMaxDelay time.Duration
}

// Checker verifies the mounts of a driver's volumes and repairs the broken
// ones, so that pods survive the restart of a node plugin (kubernetes#96361:
// a FUSE driver restarted leaves every mount at "transport endpoint is not
// connected", and the kubelet never republishes). The kubelet has no such
// step.
//
// A check of a driver runs when the driver registers, when its lost
// connection comes back (a driver container restarted next to a registrar
// that kept running registers no more) and, for the configured drivers,
// periodically. It probes
// the staging path of every Staged volume of the driver and the target of
// every Published use: a path whose stat fails with a broken-mount error
// (operations.IsBrokenMount: ENOTCONN, EIO, ESTALE, ECONNABORTED, ...) or
// that is missing is broken; a path that is no longer a mount point is
// broken when it was one at the last check or after its last stage or
// publish (a filesystem target must always be one). Drivers do not replace
// a broken mount when asked to set it up again (see
// operations/brokenmount.go), so a broken mount is torn down first, as the
// kubelet's teardown would: a broken staging path is repaired at once by
// Stage, which sends NodeUnpublishVolume for every target of the volume
// (left uncertain), NodeUnstageVolume and NodeStageVolume, and the targets
// are handed to the reconciler, which publishes them again; a broken
// target's publish is marked uncertain, so that the pod is not ready
// meanwhile, and handed to the reconciler, whose Publish sends
// NodeUnpublishVolume and then NodePublishVolume. A teardown that fails is
// retried with backoff and nothing is recorded as torn down. Healthy mounts
// get no call, nor does a staging path with a healthy target. Each
// broken path and each recovery is counted
// (csi_volmgr_broken_mounts_total, csi_volmgr_mount_recoveries_total) and a
// recovered pod gets a VolumeMountRecovered Event.
//
// Volumes a container orchestrator staged or published through the front
// endpoint are the caller's: not checked.
type Checker struct {
	cfg    Config
	mounts Mounts
	queue  workqueue.TypedRateLimitingInterface[string]
	sem    chan struct{}

	broken    *prometheus.CounterVec
	recovered *prometheus.CounterVec

	// mu guards the fields below.
	mu sync.Mutex
	// mounted holds, per path, whether it was a mount point when last seen
	// healthy (after a stage or publish, or at a check).
	mounted map[string]bool
	// repairing holds the uses whose publish was marked uncertain by a
	// check, with why, until they are published again.
	repairing map[volume.PodKey]string
	// probing holds the paths whose probe still runs (hung).
	probing map[string]bool
}

// New returns a Checker; Run starts it.
func New(cfg Config) (*Checker, error) {
	if cfg.State == nil || cfg.Desired == nil || cfg.Operations == nil || cfg.Requeue == nil {
		return nil, errors.New("mountcheck: State, Desired, Operations and Requeue are required")
	}
	if cfg.Mounts == nil {
		cfg.Mounts = mount.New("")
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 10 * time.Second
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 8
	}
	if cfg.RetryBaseDelay == 0 {
		cfg.RetryBaseDelay = 500 * time.Millisecond
	}
	if cfg.RetryMaxDelay == 0 {
		cfg.RetryMaxDelay = 2*time.Minute + 2*time.Second
	}
	c := &Checker{
		cfg:    cfg,
		mounts: cfg.Mounts,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBaseDelay, cfg.RetryMaxDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: QueueName}),
		sem: make(chan struct{}, cfg.Concurrency),
		broken: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csi_volmgr_broken_mounts_total",
			Help: "Mounts of volumes found broken (a stat error such as ENOTCONN, missing, or no longer a mount point) by the mount check, by driver and path (staging or target)",
		}, []string{"driver", "path"}),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csi_volmgr_mount_recoveries_total",
			Help: "Broken mounts of volumes set up again (NodeStageVolume or NodePublishVolume at the same path), by driver and path (staging or target)",
		}, []string{"driver", "path"}),
		mounted:   map[string]bool{},
		repairing: map[volume.PodKey]string{},
		probing:   map[string]bool{},
	}
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{c.broken, c.recovered} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("registering mount check metrics: %w", err)
			}
		}
	}
	return c, nil
}

// DriverRegistered checks the mounts of a driver that registered or
// re-registered, or whose lost connection came back (a driver restarted
// without registering again). It does not block.
func (c *Checker) DriverRegistered(driver string) {
	c.queue.Forget(driver)
	c.queue.Add(driver)
}

// Run checks until ctx ends; checks start once the desired state synced.
func (c *Checker) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("mount-check")
	ctx = klog.NewContext(ctx, logger)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	if c.cfg.Synced != nil {
		select {
		case <-ctx.Done():
			return
		case <-c.cfg.Synced:
		}
	}
	var wg sync.WaitGroup
	if c.cfg.Period > 0 {
		wg.Go(func() {
			t := time.NewTicker(c.cfg.Period)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					for _, d := range c.periodicDrivers() {
						c.queue.Add(d)
					}
				}
			}
		})
	}
	for {
		driver, shutdown := c.queue.Get()
		if shutdown {
			break
		}
		if err := c.check(ctx, driver); err != nil && ctx.Err() == nil {
			logger.Info("Repairing broken mounts failed; will retry with backoff", "driver", driver, "err", err)
			c.queue.AddRateLimited(driver)
		} else {
			c.queue.Forget(driver)
		}
		c.queue.Done(driver)
	}
	wg.Wait()
}

// periodicDrivers are the drivers with volumes that the period checks.
func (c *Checker) periodicDrivers() []string {
	var out []string
	for _, v := range c.cfg.State.Snapshot() {
		if (len(c.cfg.Drivers) == 0 || slices.Contains(c.cfg.Drivers, v.Driver)) && !slices.Contains(out, v.Driver) {
			out = append(out, v.Driver)
		}
	}
	return out
}

// check verifies and repairs the mounts of one driver's volumes.
func (c *Checker) check(ctx context.Context, driver string) error {
	logger := klog.FromContext(ctx).WithValues("driver", driver)
	var errs []error
	for _, v := range c.cfg.State.Snapshot() {
		if v.Driver != driver || v.External {
			continue
		}
		if err := c.checkVolume(klog.NewContext(ctx, logger.WithValues("volume", v.Name)), v); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkVolume probes one volume's staging path and targets, staging again
// first when the staging path is broken.
func (c *Checker) checkVolume(ctx context.Context, v asw.VolumeStatus) error {
	logger := klog.FromContext(ctx)
	src, wanted := c.cfg.Desired.Volume(v.Name)
	if v.Stage == volume.Staged && v.StagingPath != "" && wanted && !src.Inline {
		if reason := c.probe(ctx, v.StagingPath, false); reason != "" {
			logger.Info("Staging path is broken; staging the volume again", "stagingTargetPath", v.StagingPath, "reason", reason)
			c.broken.WithLabelValues(v.Driver, "staging").Inc()
			err := c.cfg.Operations.Stage(ctx, v.Name, src, c.stageFSGroup(v.Name))
			if errors.Is(err, volume.ErrNotWanted) {
				// Forgotten while the stage waited for the volume's lock
				// (behind the reconciler's unstage): nothing to repair.
				logger.V(2).Info("Volume no longer wanted; not staged again")
				return nil
			}
			if err != nil {
				return fmt.Errorf("staging %s again at %s: %w", v.Name, v.StagingPath, err)
			}
			c.recovered.WithLabelValues(v.Driver, "staging").Inc()
			logger.Info("Staged the volume again", "stagingTargetPath", v.StagingPath)
			c.requeueUnpublished(v.Name, reason)
		}
	}
	targetMustMount := v.AccessType == volume.Filesystem
	for _, p := range v.Pods {
		if p.State != volume.Published || p.External || p.TargetPath == "" {
			continue
		}
		if _, ok := c.cfg.Desired.PodVolume(p.Key); !ok {
			continue
		}
		if now, ok := c.cfg.State.Pod(p.Key); !ok || now.State != volume.Published {
			// The repair of the staging path unpublished it: requeued.
			continue
		}
		reason := c.probe(ctx, p.TargetPath, targetMustMount)
		if reason == "" {
			continue
		}
		logger.Info("Pod's mount of the volume is broken; publishing it again", "podUID", p.Key.Pod, "targetPath", p.TargetPath, "reason", reason)
		c.broken.WithLabelValues(v.Driver, "target").Inc()
		c.mu.Lock()
		c.repairing[p.Key] = reason
		c.mu.Unlock()
		err := fmt.Errorf("%w: %s is %s", ErrMountBroken, p.TargetPath, reason)
		markErr := c.cfg.Operations.MarkMountUncertain(ctx, p.Key, volume.StepPublish, err)
		if _, known := c.cfg.State.Pod(p.Key); markErr != nil || !known {
			// Not marked, or torn down while the mark waited for the
			// use's lock: no publish will end this repair.
			c.mu.Lock()
			delete(c.repairing, p.Key)
			c.mu.Unlock()
		}
		if markErr != nil {
			return markErr
		}
		c.cfg.Requeue(p.Key)
	}
	return nil
}

// requeueUnpublished hands to the reconciler the wanted uses of a volume
// whose publish the repair of its staging path left uncertain (their
// targets were unpublished to unstage it), to be published again.
func (c *Checker) requeueUnpublished(name volume.Name, reason string) {
	for _, uid := range c.cfg.Desired.VolumePods(name) {
		key := volume.PodKey{Volume: name, Pod: uid}
		p, ok := c.cfg.State.Pod(key)
		if !ok || p.State != volume.PublishUncertain || p.External {
			continue
		}
		c.mu.Lock()
		c.repairing[key] = "staging path " + reason
		c.mu.Unlock()
		c.cfg.Requeue(key)
	}
}

// stageFSGroup is the fsGroup a stage sends: the first wanting pod's.
func (c *Checker) stageFSGroup(name volume.Name) *int64 {
	for _, uid := range c.cfg.Desired.VolumePods(name) {
		if use, ok := c.cfg.Desired.PodVolume(volume.PodKey{Volume: name, Pod: uid}); ok {
			return use.Volume.FSGroup
		}
	}
	return nil
}

// observe remembers whether path is a mount point after a successful step,
// the baseline of the next check.
func (c *Checker) observe(path string) {
	if path == "" {
		return
	}
	mounted, err := c.mounts.IsMountPoint(path)
	if err != nil {
		return
	}
	c.mu.Lock()
	c.mounted[path] = mounted
	c.mu.Unlock()
}

// published is told of every successful publish: the baseline of its
// target, and the end of a repair.
func (c *Checker) published(ctx context.Context, key volume.PodKey, src volume.Source, pv volume.PodVolume) {
	p, ok := c.cfg.State.Pod(key)
	if !ok {
		return
	}
	c.observe(p.TargetPath)
	c.mu.Lock()
	reason, repaired := c.repairing[key]
	delete(c.repairing, key)
	c.mu.Unlock()
	if !repaired {
		return
	}
	c.recovered.WithLabelValues(src.Driver, "target").Inc()
	klog.FromContext(ctx).Info("Published a broken mount again", "volume", key.Volume, "podUID", key.Pod, "targetPath", p.TargetPath)
	if c.cfg.Events != nil {
		c.cfg.Events.Pod(pv.Pod, corev1.EventTypeNormal, status.EventVolumeRecovered,
			fmt.Sprintf("The mount of volume %q at %s was broken (%s) and has been set up again", displayName(src, pv), p.TargetPath, reason))
	}
}

// staged is told of every successful stage: the baseline of its staging
// path.
func (c *Checker) staged(name volume.Name) {
	if v, ok := c.cfg.State.Volume(name); ok {
		c.observe(v.StagingPath)
	}
}

// forget drops what is known of a use that was torn down, and of its
// target.
func (c *Checker) forget(key volume.PodKey, target string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.repairing, key)
	if target != "" {
		delete(c.mounted, target)
	}
}

// forgetPath drops the baseline of a path that was torn down (a staging
// path after its unstage): a node that runs many short pods would
// otherwise keep one entry per path it ever saw.
func (c *Checker) forgetPath(path string) {
	if path == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mounted, path)
}

// mapSizes counts the entries of the checker's maps; for tests that check
// that they do not grow with the pods and volumes seen.
func (c *Checker) mapSizes() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return map[string]int{"mounted": len(c.mounted), "repairing": len(c.repairing), "probing": len(c.probing)}
}

func displayName(src volume.Source, pv volume.PodVolume) string {
	if src.PVName != "" {
		return src.PVName
	}
	return pv.SpecName
}
