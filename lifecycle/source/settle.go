package source

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// A by-name watch costs the API server memory and CPU for as long as it is
// open (issue 17 measured it per watch; a fleet of agents holds one per
// referenced PVC, PV and VolumeAttachment), while most referenced objects
// stop changing in any way that matters to the node once the volume is
// usable: a claim bound to its volume, a volume bound to its claim, an
// attachment attached. Such an object is settled: its watch ends (or never
// starts), the cache keeps the object as last read, and it is read again
// with a GET every period (jittered), so that what does change later — an
// expansion, a deletion — is still seen, a period late at most; an object
// read in another state is watched again until it settles. A change of a
// claim also reads the volumes of its pods again at once, so that an
// expansion, which changes the claim after the volume, is followed closely.

// settling is the settle rule of one kind and its re-reads.
type settling struct {
	// settled says whether an object of the kind has settled.
	settled func(obj runtime.Object) bool
	// period is the mean time between two reads of a settled object.
	period time.Duration
	// queue holds the settled objects' next reads.
	queue workqueue.TypedDelayingInterface[cache.ObjectName]
}

func newSettling(kind Kind, period time.Duration) *settling {
	rule := settledRules[kind]
	if rule == nil || period <= 0 {
		return nil
	}
	return &settling{settled: rule, period: period, queue: workqueue.NewTypedDelayingQueue[cache.ObjectName]()}
}

// settledRules are the kinds' settle rules.
var settledRules = map[Kind]func(runtime.Object) bool{
	KindPersistentVolumeClaim: func(obj runtime.Object) bool {
		pvc, ok := obj.(*corev1.PersistentVolumeClaim)
		if !ok || pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
			return false
		}
		// Anything in flight (a resize, its conditions) keeps it watched.
		if len(pvc.Status.Conditions) > 0 || len(pvc.Status.AllocatedResourceStatuses) > 0 {
			return false
		}
		want, have := pvc.Spec.Resources.Requests[corev1.ResourceStorage], pvc.Status.Capacity[corev1.ResourceStorage]
		return want.Cmp(have) <= 0
	},
	KindPersistentVolume: func(obj runtime.Object) bool {
		pv, ok := obj.(*corev1.PersistentVolume)
		return ok && pv.Status.Phase == corev1.VolumeBound && pv.Spec.ClaimRef != nil && pv.DeletionTimestamp == nil
	},
	KindVolumeAttachment: func(obj runtime.Object) bool {
		va, ok := obj.(*storagev1.VolumeAttachment)
		return ok && va.Status.Attached && va.Status.AttachError == nil && va.Status.DetachError == nil && va.DeletionTimestamp == nil
	},
}

// next schedules key's next read, a period from now with ±50 % jitter so
// that objects read together are not read together again.
func (s *settling) next(key cache.ObjectName) {
	s.queue.AddAfter(key, time.Duration(float64(s.period)*(0.5+rand.Float64())))
}

// run reads settled objects again, one at a time, until ctx ends.
func (s *settling) run(ctx context.Context, c *byNameCache) {
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	for {
		key, shutdown := s.queue.Get()
		if shutdown {
			return
		}
		c.reread(ctx, key)
		s.queue.Done(key)
	}
}

// firstRead takes the result of an object's first read: a settled object is
// cached and read again later; any other result starts the object's
// reflector (with the object read, if any, as its first list).
func (c *byNameCache) firstRead(ctx context.Context, key cache.ObjectName, obj runtime.Object, err error) {
	c.mu.Lock()
	item, ok := c.items[key]
	if !ok || item.cancel != nil || ctx.Err() != nil {
		c.mu.Unlock()
		return
	}
	if err != nil || c.settling == nil || !c.settling.settled(obj) {
		var seed runtime.Object
		if err == nil {
			seed = obj
		}
		c.startLocked(ctx, key, item, seed, apierrors.IsNotFound(err))
		c.mu.Unlock()
		if err != nil && !apierrors.IsNotFound(err) {
			// Outside c.mu, as put below.
			item.store.failed(err)
		}
		return
	}
	item.settled = true
	c.mu.Unlock()
	// Outside c.mu: the change callback takes the Source's lock, which is
	// held while the Source calls watch (and so takes c.mu). The store's
	// settle hook schedules the next read.
	item.store.put(obj, true)
}

// awaitsFirstRead says whether key is referenced and has neither an
// object read nor a reflector: its first read is still to be made.
func (c *byNameCache) awaitsFirstRead(key cache.ObjectName) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	item, ok := c.items[key]
	return ok && item.awaitsFirstRead()
}

// awaitingFirstRead returns the keys of namespace ns that await their
// first read.
func (c *byNameCache) awaitingFirstRead(ns string) []cache.ObjectName {
	c.mu.Lock()
	defer c.mu.Unlock()
	var keys []cache.ObjectName
	for key, item := range c.items {
		if key.Namespace == ns && item.awaitsFirstRead() {
			keys = append(keys, key)
		}
	}
	return keys
}

func (item *watchItem) awaitsFirstRead() bool {
	if item.cancel != nil || item.settled {
		return false
	}
	_, synced := item.store.get()
	return !synced
}

// settle ends key's watch once its object settled, and schedules its next
// read. It runs in the reflector's goroutine (objectStore.put).
func (c *byNameCache) settle(key cache.ObjectName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	item, ok := c.items[key]
	if !ok {
		return
	}
	if item.cancel != nil {
		item.cancel()
		item.cancel = nil
		item.store.newGeneration()
	}
	item.settled = true
	c.settling.next(key)
}

// refresh reads a settled object again now.
func (c *byNameCache) refresh(key cache.ObjectName) {
	if c.settling == nil {
		return
	}
	c.mu.Lock()
	item, ok := c.items[key]
	settled := ok && item.settled
	c.mu.Unlock()
	if settled {
		c.settling.queue.Add(key)
	}
}

// read reads key's object from the API server now (Source.ReadPVC). A
// settled object's cache takes what was read, as its re-read would; a
// watched object's cache is left to its watch.
func (c *byNameCache) read(ctx context.Context, key cache.ObjectName) (runtime.Object, error) {
	c.mu.Lock()
	item, ok := c.items[key]
	settled := ok && item.settled
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotReferenced)
	}
	obj, err := c.lw.get(ctx, key.Namespace, key.Name)
	if settled && (err == nil || apierrors.IsNotFound(err)) {
		if err == nil {
			item.store.put(obj, false) // a settled object's hook schedules its next read
		}
		if err != nil || !c.settling.settled(obj) {
			// Gone, or no longer settled: the re-read, in the context the
			// watches run in, watches it again.
			c.settling.queue.Add(key)
		}
	}
	if err != nil {
		return nil, err
	}
	return obj, nil
}

// reread reads a settled object again: the cache gets what it is now; one
// that is gone or no longer settled is watched again.
func (c *byNameCache) reread(ctx context.Context, key cache.ObjectName) {
	c.mu.Lock()
	item, ok := c.items[key]
	settled := ok && item.settled
	c.mu.Unlock()
	if !settled {
		return // unwatched, or watched again meanwhile
	}
	obj, err := c.lw.get(ctx, key.Namespace, key.Name)
	switch {
	case apierrors.IsNotFound(err):
		item.store.put(nil, true)
		obj = nil
	case err != nil:
		klog.FromContext(ctx).V(4).Info("Reading a settled object failed; will retry", "kind", c.kind, "object", key, "err", err)
		c.settling.queue.AddAfter(key, c.settling.period/10)
		return
	case c.settling.settled(obj):
		item.store.put(obj, false) // its settle hook schedules the next read
		return
	default:
		item.store.put(obj, false)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.items[key] == item && item.cancel == nil && ctx.Err() == nil {
		c.startLocked(ctx, key, item, obj, obj == nil)
	}
}
