package expand

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/keymutex"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// QueueName names the expansion queue in the workqueue metrics.
const QueueName = "csi_volmgr_expand"

// Claims reads claims and volumes from the caches the pods' references
// keep; *source.Source implements it. Objects returned are shared: never
// modified.
type Claims interface {
	// PVC returns a referenced claim.
	PVC(namespace, name string) (*corev1.PersistentVolumeClaim, error)
	// PV returns a referenced PersistentVolume.
	PV(name string) (*corev1.PersistentVolume, error)
	// ReadPVC reads a referenced claim from the API server now: the
	// cache's copy may be older than its volume's.
	ReadPVC(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error)
}

// Operations runs NodeExpandVolume; *operations.Operations implements it.
type Operations interface {
	// Expand grows the published volume's file system for the pod of key.
	Expand(ctx context.Context, key volume.PodKey, src volume.Source, requiredBytes int64) (int64, error)
	// MarkMountUncertain records the pod's publish as uncertain after an
	// expansion during the mount failed.
	MarkMountUncertain(ctx context.Context, key volume.PodKey, step volume.Step, err error) error
}

// DesiredState is the part of the desired state the expander reads;
// *dsw.Store implements it.
type DesiredState interface {
	Volume(name volume.Name) (volume.Source, bool)
	VolumePods(name volume.Name) []types.UID
	PodVolume(key volume.PodKey) (dsw.Use, bool)
	Pod(uid types.UID) (dsw.Pod, bool)
}

// ActualState is the part of the actual state the expander reads;
// *asw.World implements it.
type ActualState interface {
	Pod(key volume.PodKey) (asw.Pod, bool)
}

// Events records the expansion's Events; *status.Events implements it.
type Events interface {
	// Pod records an Event on a pod.
	Pod(pod volume.PodInfo, eventType, reason, message string)
	// Claim records an Event on a claim.
	Claim(namespace, name string, uid types.UID, eventType, reason, message string)
}

// Config configures an Expander. Every field but Now, NodeName and the
// queue knobs is required.
type Config struct {
	Claims     Claims
	Client     kubernetes.Interface
	Desired    DesiredState
	Actual     ActualState
	Operations Operations
	Events     Events
	// NodeName goes into the success Events, as the kubelet's.
	NodeName string
	// RetryBaseDelay and RetryMaxDelay bound the per-volume backoff; 0
	// means the kubelet's 500ms and 2m2s.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// MetricsProvider names the queue's metrics; nil uses client-go's
	// global provider.
	MetricsProvider workqueue.MetricsProvider
	// Now stamps claim conditions; nil is the wall clock.
	Now func() time.Time
	// Gate, when set, holds every expansion (and its claim status writes)
	// back while the agent does not own its Node (*nodeowner.Gate).
	Gate interface {
		Wait(ctx context.Context) error
	}
}

// Expander grows the file systems of volumes whose claims were resized:
// the kubelet's in-use expansion (reconciler_common.go expandVolume,
// GenerateExpandInUseVolumeFunc) and its expansion during the mount
// (expandVolumeDuringMount), both through node_expander.go's rules with
// RecoverVolumeExpansionFailure (GA), and the older resizers'
// FileSystemResizePending path for claims without allocatedResources.
//
// In-use expansion is event-driven: a change of a claim or its volume (the
// pods' reference watches report them as pod changes) enqueues the pods'
// volumes; a worker compares the PV's capacity with the size the volume
// has on this node (first the claim's status.capacity, then what the last
// expansion reached) and calls NodeExpandVolume on one published, writable
// use. Failures are retried with per-volume backoff.
type Expander struct {
	cfg    Config
	writer claimWriter
	queue  workqueue.TypedRateLimitingInterface[volume.Name]
	// locks serializes the expansion of one volume between the in-use
	// worker and the mount path.
	locks keymutex.KeyMutex

	// mu guards the maps below.
	mu sync.Mutex
	// sizes is the size each volume's file system has on this node (the
	// kubelet's actual-state persistentVolumeSize).
	sizes map[volume.Name]resource.Quantity
	// noOnline holds volumes whose driver refused expansion while in use
	// (FailedPrecondition): no retry on this node (MarkForInUseExpansionError).
	noOnline map[volume.Name]bool
	// finalErr holds volumes whose last expansion failed with a final error
	// (volumesWithFinalExpansionErrors).
	finalErr map[volume.Name]bool
}

// New returns an Expander; Run starts its workers.
func New(cfg Config) (*Expander, error) {
	if cfg.Claims == nil || cfg.Client == nil || cfg.Desired == nil || cfg.Actual == nil || cfg.Operations == nil || cfg.Events == nil {
		return nil, errors.New("expand: Claims, Client, Desired, Actual, Operations and Events are required")
	}
	if cfg.RetryBaseDelay == 0 {
		cfg.RetryBaseDelay = 500 * time.Millisecond
	}
	if cfg.RetryMaxDelay == 0 {
		cfg.RetryMaxDelay = 2*time.Minute + 2*time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Expander{
		cfg:      cfg,
		writer:   claimWriter{client: cfg.Client, now: func() metav1.Time { return metav1.NewTime(cfg.Now()) }},
		locks:    keymutex.NewHashed(0),
		sizes:    map[volume.Name]resource.Quantity{},
		noOnline: map[volume.Name]bool{},
		finalErr: map[volume.Name]bool{},
	}
	e.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[volume.Name](cfg.RetryBaseDelay, cfg.RetryMaxDelay),
		workqueue.TypedRateLimitingQueueConfig[volume.Name]{Name: QueueName, MetricsProvider: cfg.MetricsProvider})
	return e, nil
}

// PodChanged enqueues the PersistentVolumes of a pod whose objects changed
// (the pod, its claims or their volumes). It does not block.
func (e *Expander) PodChanged(uid types.UID) {
	p, ok := e.cfg.Desired.Pod(uid)
	if !ok {
		return
	}
	for _, u := range p.Uses {
		if !u.Source.Inline && u.Source.PVName != "" {
			e.queue.Add(u.Name)
		}
	}
}

// VolumeChanged enqueues a volume whose desired state changed (e.g. its
// PV's capacity). It does not block.
func (e *Expander) VolumeChanged(name volume.Name) { e.queue.Add(name) }

// Run works the queue with workers goroutines until ctx ends.
func (e *Expander) Run(ctx context.Context, workers int) {
	logger := klog.FromContext(ctx).WithName("expand")
	ctx = klog.NewContext(ctx, logger)
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for e.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	e.queue.ShutDown()
	wg.Wait()
}

func (e *Expander) processNext(ctx context.Context) bool {
	name, shutdown := e.queue.Get()
	if shutdown {
		return false
	}
	defer e.queue.Done(name)
	if e.cfg.Gate != nil && e.cfg.Gate.Wait(ctx) != nil {
		return false // shutting down
	}
	if err := e.syncInUse(ctx, name); err != nil {
		if ctx.Err() == nil {
			klog.FromContext(ctx).V(2).Info("Expanding the volume failed; will retry with backoff", "volume", name, "err", err)
			e.queue.AddRateLimited(name)
		}
		return true
	}
	e.queue.Forget(name)
	return true
}

// syncInUse expands one volume that is in use on this node, if its claim
// was resized.
func (e *Expander) syncInUse(ctx context.Context, name volume.Name) error {
	src, ok := e.cfg.Desired.Volume(name)
	if !ok {
		e.forget(name)
		return nil
	}
	if src.Inline || src.PVName == "" {
		return nil
	}
	e.locks.LockKey(string(name))
	defer func() { _ = e.locks.UnlockKey(string(name)) }()
	pv, pvc, err := e.claimOf(src)
	if err != nil || pvc == nil {
		// Not cached yet or gone: the watch reports it.
		return nil
	}
	key, use, ok := e.publishedUse(name)
	if !ok {
		// Nothing published: the mount expands it.
		return nil
	}
	desired := pv.Spec.Capacity[corev1.ResourceStorage]
	current := e.size(name, pvc)
	if desired.IsZero() || current.IsZero() || desired.Cmp(current) <= 0 || e.flag(e.noOnline, name) {
		return nil
	}
	if pvc, err = e.readClaim(ctx, pv); err != nil || pvc == nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("volume", name, "pvc", klog.KObj(pvc), "pod", klog.KRef(use.Volume.Pod.Namespace, use.Volume.Pod.Name))
	logger.V(2).Info("Volume needs expansion on the node", "size", current.String(), "desiredSize", desired.String())
	r := e.newResize(key, use, pv, pvc, current, desired)
	done, newSize, err := r.run(ctx, e)
	if err != nil {
		e.cfg.Events.Pod(use.Volume.Pod, corev1.EventTypeWarning, status.EventVolumeResizeFailed,
			fmt.Sprintf("NodeExpandVolume.NodeExpandVolume failed for volume %q : %v", src.PVName, err))
		return err
	}
	if done {
		e.setSize(name, newSize)
	}
	return nil
}

// ExpandAfterPublish expands, right after a publish, a volume whose claim
// was resized while no pod used it (the kubelet's expandVolumeDuringMount):
// the pod becomes ready only once its volume has the claim's size. When
// the expansion fails, the pod's publish is marked uncertain (not ready,
// published again and expanded again with backoff), the error returned.
func (e *Expander) ExpandAfterPublish(ctx context.Context, key volume.PodKey, use dsw.Use) error {
	src := use.Source
	if src.Inline || src.PVName == "" {
		return nil
	}
	e.locks.LockKey(string(key.Volume))
	defer func() { _ = e.locks.UnlockKey(string(key.Volume)) }()
	err := e.expandDuringMount(ctx, key, use)
	if err == nil {
		return nil
	}
	if markErr := e.cfg.Operations.MarkMountUncertain(ctx, key, volume.StepExpand, err); markErr != nil {
		klog.FromContext(ctx).Error(markErr, "Marking the mount uncertain after a failed expansion failed", "volume", key.Volume, "podUID", key.Pod)
	}
	return err
}

func (e *Expander) expandDuringMount(ctx context.Context, key volume.PodKey, use dsw.Use) error {
	pv, pvc, err := e.claimOf(use.Source)
	if err != nil {
		return fmt.Errorf("reading the claim of PV %s to check its size: %w", use.Source.PVName, err)
	}
	if pvc == nil {
		return nil
	}
	claimSize := pvc.Status.Capacity[corev1.ResourceStorage]
	pvSize := pv.Spec.Capacity[corev1.ResourceStorage]
	if claimSize.Cmp(pvSize) >= 0 {
		return nil
	}
	if pvc, err = e.readClaim(ctx, pv); err != nil || pvc == nil {
		return err
	}
	if claimSize = pvc.Status.Capacity[corev1.ResourceStorage]; claimSize.Cmp(pvSize) >= 0 {
		return nil
	}
	r := e.newResize(key, use, pv, pvc, claimSize, pvSize)
	done, newSize, err := r.run(ctx, e)
	if err != nil {
		return err
	}
	if done {
		e.setSize(key.Volume, newSize)
	}
	return nil
}

// claimOf returns a PersistentVolume and the claim it is bound to; a nil
// claim when the PV has none or the claim is not the one bound.
func (e *Expander) claimOf(src volume.Source) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim, error) {
	pv, err := e.cfg.Claims.PV(src.PVName)
	if err != nil {
		return nil, nil, err
	}
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return pv, nil, nil
	}
	pvc, err := e.cfg.Claims.PVC(ref.Namespace, ref.Name)
	if err != nil {
		return nil, nil, err
	}
	if ref.UID != "" && pvc.UID != ref.UID {
		return pv, nil, nil
	}
	return pv, pvc, nil
}

// readClaim reads the claim pv is bound to from the API server, before an
// expansion: the claim's status decides how the volume is expanded and is
// written next, with its resourceVersion as a precondition. The cached
// copy can be older than pv's: the claim of a settled volume is read again
// only every period, and an expansion changes the volume before the claim.
// A nil claim means pv is no longer bound to it.
func (e *Expander) readClaim(ctx context.Context, pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	ref := pv.Spec.ClaimRef
	pvc, err := e.cfg.Claims.ReadPVC(ctx, ref.Namespace, ref.Name)
	if err != nil {
		return nil, fmt.Errorf("reading PVC %s/%s before expanding its volume: %w", ref.Namespace, ref.Name, err)
	}
	if ref.UID != "" && pvc.UID != ref.UID {
		return nil, nil
	}
	return pvc, nil
}

// publishedUse returns a use of the volume whose publish is done and that
// mounts it writable: expansion needs a target path and is skipped for
// read-only uses (checkVolumeFSResize).
func (e *Expander) publishedUse(name volume.Name) (volume.PodKey, dsw.Use, bool) {
	for _, uid := range e.cfg.Desired.VolumePods(name) {
		key := volume.PodKey{Volume: name, Pod: uid}
		use, ok := e.cfg.Desired.PodVolume(key)
		if !ok || use.Volume.ReadOnly {
			continue
		}
		if p, ok := e.cfg.Actual.Pod(key); ok && p.State == volume.Published {
			return key, use, true
		}
	}
	return volume.PodKey{}, dsw.Use{}, false
}

// size is the volume's size on this node: what the last expansion
// reached, or the claim's status.capacity (InitializeClaimSize).
func (e *Expander) size(name volume.Name, pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.sizes[name]; ok {
		return s
	}
	s := pvc.Status.Capacity[corev1.ResourceStorage]
	if !s.IsZero() {
		e.sizes[name] = s
	}
	return s
}

func (e *Expander) setSize(name volume.Name, s resource.Quantity) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sizes[name] = s
}

func (e *Expander) flag(m map[volume.Name]bool, name volume.Name) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return m[name]
}

func (e *Expander) setFlag(m map[volume.Name]bool, name volume.Name) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m[name] = true
}

// forget drops what is known of a volume that left the desired state.
func (e *Expander) forget(name volume.Name) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.sizes, name)
	delete(e.noOnline, name)
	delete(e.finalErr, name)
}
