package podfinalizer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// QueueName names the finalizer's queue in the workqueue metrics.
const QueueName = "csi_volmgr_pod_finalizer"

// Pods are the node's pods; *source.Source implements it.
type Pods interface {
	// Pod returns the node's pod with the given UID from the cache.
	Pod(uid types.UID) (*corev1.Pod, bool)
	// OnPodChange subscribes fn to changes of the node's pods.
	OnPodChange(fn func(uid types.UID))
}

// DesiredState is the desired state of world; *dsw.Store implements it.
type DesiredState interface {
	// HasPod says whether the populator still holds the pod.
	HasPod(uid types.UID) bool
}

// ActualState is the actual state of world; *asw.World implements it.
type ActualState interface {
	// PodVolumes returns every recorded publish of the pod, in any state.
	PodVolumes(pod types.UID) []asw.Pod
}

var _ Pods = &source.Source{}

// Config configures a Finalizer. Client, Pods, Desired, Actual and Layout
// are required.
type Config struct {
	// Client deletes the pods.
	Client kubernetes.Interface
	// Pods are the node's pods.
	Pods Pods
	// Desired and Actual are the lifecycle's states.
	Desired DesiredState
	Actual  ActualState
	// Layout finds the pods' volume directories under the root directory.
	Layout paths.Layout
	// MetricsProvider names the queue's metrics; nil uses client-go's
	// global provider.
	MetricsProvider workqueue.MetricsProvider
	// RetryBaseDelay and RetryMaxDelay bound the backoff of failed deletes
	// and of pods whose volume directories are still on disk; 0 means
	// 500ms and 2m2s.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// Gate, when set, holds every deletion back while the agent does not
	// own its Node (*nodeowner.Gate).
	Gate interface {
		Wait(ctx context.Context) error
	}
}

// Finalizer completes the deletion of the node's pods; see the package
// documentation.
type Finalizer struct {
	cfg   Config
	queue workqueue.TypedRateLimitingInterface[types.UID]
}

// New returns a Finalizer subscribed to the node's pods; Run starts it.
func New(cfg Config) (*Finalizer, error) {
	if cfg.Client == nil || cfg.Pods == nil || cfg.Desired == nil || cfg.Actual == nil || cfg.Layout.Root() == "" {
		return nil, errors.New("podfinalizer: Client, Pods, Desired, Actual and Layout are required")
	}
	if cfg.RetryBaseDelay == 0 {
		cfg.RetryBaseDelay = 500 * time.Millisecond
	}
	if cfg.RetryMaxDelay == 0 {
		cfg.RetryMaxDelay = 2*time.Minute + 2*time.Second
	}
	f := &Finalizer{
		cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](cfg.RetryBaseDelay, cfg.RetryMaxDelay),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: QueueName, MetricsProvider: cfg.MetricsProvider}),
	}
	cfg.Pods.OnPodChange(f.PodChanged)
	return f, nil
}

// PodChanged asks the Finalizer to look at a pod again: it changed, or one
// of its volumes was torn down. It never blocks.
func (f *Finalizer) PodChanged(uid types.UID) { f.queue.Add(uid) }

// Run deletes pods until ctx ends.
func (f *Finalizer) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("podfinalizer")
	ctx = klog.NewContext(ctx, logger)
	var wg sync.WaitGroup
	wg.Go(func() {
		for f.processNext(ctx) {
		}
	})
	<-ctx.Done()
	f.queue.ShutDown()
	wg.Wait()
}

func (f *Finalizer) processNext(ctx context.Context) bool {
	uid, shutdown := f.queue.Get()
	if shutdown {
		return false
	}
	defer f.queue.Done(uid)
	if f.cfg.Gate != nil && f.cfg.Gate.Wait(ctx) != nil {
		return false // shutting down
	}
	if err := f.sync(ctx, uid); err != nil {
		if ctx.Err() == nil {
			klog.FromContext(ctx).V(2).Info("Cannot complete the pod's deletion yet; will retry", "podUID", uid, "err", err)
			f.queue.AddRateLimited(uid)
		}
		return true
	}
	f.queue.Forget(uid)
	return true
}

// errVolumesOnDisk is returned while a pod's volume directories remain.
var errVolumesOnDisk = errors.New("volume directories of the pod are still on disk")

// sync deletes the pod if it is marked for deletion and all its volumes are
// torn down: the populator let it go, the actual state holds none of its
// publishes, and no volume directory of it remains under the root (a
// publish in flight writes its record there before calling the driver).
func (f *Finalizer) sync(ctx context.Context, uid types.UID) error {
	logger := klog.FromContext(ctx)
	pod, ok := f.cfg.Pods.Pod(uid)
	if !ok || pod.DeletionTimestamp == nil {
		return nil
	}
	logger = klog.LoggerWithValues(logger, "pod", klog.KObj(pod), "podUID", uid)
	if f.cfg.Desired.HasPod(uid) {
		logger.V(4).Info("Pod marked for deletion still in the desired state; waiting")
		return nil
	}
	if vols := f.cfg.Actual.PodVolumes(uid); len(vols) > 0 {
		logger.V(4).Info("Pod marked for deletion still has volumes; waiting for their teardown", "volumes", len(vols))
		return nil
	}
	if err := f.volumeDirsGone(uid); err != nil {
		return err
	}
	err := f.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      metav1.NewUIDPreconditions(string(uid)),
	})
	switch {
	case apierrors.IsNotFound(err):
		logger.V(4).Info("Pod already deleted")
	case apierrors.IsConflict(err):
		// The UID precondition failed: the name now belongs to another pod.
		logger.V(4).Info("Pod already deleted and replaced by another of the same name")
	case err != nil:
		return fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	default:
		logger.Info("Deleted pod marked for deletion: its volumes are torn down")
	}
	return nil
}

// volumeDirsGone checks that no volume directory of the pod remains, for
// filesystem and block volumes alike.
func (f *Finalizer) volumeDirsGone(uid types.UID) error {
	for _, access := range []volume.AccessType{volume.Filesystem, volume.Block} {
		p, err := f.cfg.Layout.Publishing(uid, "x", access)
		if err != nil {
			return err
		}
		dir := filepath.Dir(p.Dir)
		if p.DeviceLink != "" {
			dir = filepath.Dir(p.DeviceLink) // block: the pod's devices
		}
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading the pod's volume directories: %w", err)
		}
		if len(entries) > 0 {
			return fmt.Errorf("%w: %s", errVolumesOnDisk, filepath.Join(dir, entries[0].Name()))
		}
	}
	return nil
}
