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
//
// A settled claim is read again more often than the other kinds: every
// SettledObjectResync but at most claimResync (1 min ± 25 %, so within
// [45 s, 75 s]). The claim is where an expansion shows (the resizer marks
// it), and the kubelet sees that on its next pod sync, every 1–1.5 min;
// re-read every 2 min ± 50 % it was seen 1–3 min late. Only the claim is
// read that often, not its volume (nor its attachment), which keeps the
// claim and volume of a pod at 1.5 GETs a minute with the default 2 min,
// under the kubelet's 1.6 (a GET of each per sync).
//
// In GET-only mode (Config.GetOnly) nothing is watched: an object that is
// not settled — or missing, or whose reads fail — is polled with GETs
// instead, pollFirst after its read, twice as long after each read that
// found no change, up to pollMax, and pollFirst again after a change;
// once it settles it is read again as above. Each poll goes through the
// same store as a watch event, so the pods and attachments waiting for
// the object are told of its changes as they are of a watch's.

// Settled re-read periods and jitters (settling.delay).
const (
	// claimResync caps the period of settled claims (see above).
	claimResync = time.Minute
	// claimJitter spreads a settled claim's reads over ±25 % of its period.
	claimJitter = 0.25
	// settledJitter spreads the other settled objects' reads over ±50 %
	// of SettledObjectResync.
	settledJitter = 0.5
)

// GET-only mode's poll of an object that is not settled (pollLocked): about
// the kubelet's schedule for the same wait. Its csi_attacher waits for a
// VolumeAttachment with GETs 500 ms apart at first, growing by 5 % a GET
// to at most 7 s, plus up to 10 % jitter (pkg/volume/csi/csi_attacher.go,
// waitForVolumeAttachDetachStatus: about 50 GETs in the first 2 minutes);
// its desired-state populator reads a claim that is not bound again only
// when the pod is synced again, a retry that backs off. Doubling from
// 500 ms to 8 s sees an attachment, a binding or an object's appearance
// within 8.8 s at most (the kubelet's waiter: 7.7 s), for about 18 GETs in
// the first 2 minutes and 7 a minute after that; the cap also spaces the
// reads of a claim or volume the Node authorizer forbids while its graph
// lags, for as long as unreadableAfter lets that pass.
const (
	// pollFirst is the first poll's interval, and the next one's after a
	// change.
	pollFirst = 500 * time.Millisecond
	// pollMax caps the interval between polls.
	pollMax = 8 * time.Second
	// pollJitter adds up to 10 % to each interval, as the kubelet's waiter
	// does, so that objects read together drift apart.
	pollJitter = 0.1
)

// settling is the settle rule of one kind and its re-reads.
type settling struct {
	// settled says whether an object of the kind has settled.
	settled func(obj runtime.Object) bool
	// period is the mean time between two reads of a settled object.
	period time.Duration
	// jitter is the share of period by which a read comes earlier or
	// later at most.
	jitter float64
	// queue holds the settled objects' next reads and, in GET-only mode,
	// the polls of the others.
	queue workqueue.TypedDelayingInterface[cache.ObjectName]
}

// newSettling returns the settle rule and re-read period of kind's objects
// (a claim's capped at claimResync), nil when objects are not to settle.
func newSettling(kind Kind, period time.Duration) *settling {
	rule := settledRules[kind]
	if rule == nil || period <= 0 {
		return nil
	}
	jitter := settledJitter
	if kind == KindPersistentVolumeClaim {
		period, jitter = min(period, claimResync), claimJitter
	}
	return &settling{settled: rule, period: period, jitter: jitter, queue: workqueue.NewTypedDelayingQueue[cache.ObjectName]()}
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

// next schedules key's next read, a period from now with jitter so that
// objects read together are not read together again.
func (s *settling) next(key cache.ObjectName) { s.queue.AddAfter(key, s.delay()) }

// delay returns the time until a settled object's next read: period ±
// jitter.
func (s *settling) delay() time.Duration {
	return time.Duration(float64(s.period) * (1 - s.jitter + 2*s.jitter*rand.Float64()))
}

// run reads settled objects again, and polls the others in GET-only mode,
// one at a time, until ctx ends.
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
// reflector (with the object read, if any, as its first list), or in
// GET-only mode is cached and polled (afterRead).
func (c *byNameCache) firstRead(ctx context.Context, key cache.ObjectName, obj runtime.Object, err error) {
	c.mu.Lock()
	item, ok := c.items[key]
	if !ok || item.cancel != nil || ctx.Err() != nil {
		c.mu.Unlock()
		return
	}
	if c.getOnly {
		c.mu.Unlock()
		c.afterRead(ctx, key, item, obj, err)
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
	if item.cancel != nil || item.settled || item.poll > 0 {
		return false
	}
	_, synced := item.store.get()
	return !synced
}

// unwatchedLocked says whether item is read by GETs of the settling queue:
// settled, or polled in GET-only mode. c.mu must be held.
func (item *watchItem) unwatchedLocked() bool {
	return item.cancel == nil && (item.settled || item.poll > 0)
}

// settle ends the watch (or poll) of key's item once its object settled,
// and schedules its next read; an item no longer key's (unwatched, perhaps
// watched anew) is left alone. It runs in the goroutine that stored the
// object (objectStore.put).
func (c *byNameCache) settle(key cache.ObjectName, item *watchItem) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.items[key] != item {
		return
	}
	if item.cancel != nil {
		item.cancel()
		item.cancel = nil
		item.store.newGeneration()
	}
	item.settled, item.poll = true, 0
	c.settling.next(key)
}

// pollLocked schedules the next GET of key's object (GET-only mode), which
// is not settled, missing or could not be read: pollFirst after its first
// read and after a read that changed it, twice the last interval after any
// other, up to pollMax, each with up to pollJitter more. c.mu must be
// held.
func (c *byNameCache) pollLocked(key cache.ObjectName, item *watchItem, changed bool) {
	if changed || item.poll == 0 {
		item.poll = pollFirst
	} else {
		item.poll = min(2*item.poll, pollMax)
	}
	item.settled = false
	c.settling.queue.AddAfter(key, time.Duration(float64(item.poll)*(1+pollJitter*rand.Float64())))
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

// read reads key's object from the API server now (Source.ReadPVC). The
// cache of an object that is not watched (settled, or polled in GET-only
// mode) takes what was read, as its re-read would; a watched object's
// cache is left to its watch.
func (c *byNameCache) read(ctx context.Context, key cache.ObjectName) (runtime.Object, error) {
	c.mu.Lock()
	item, ok := c.items[key]
	unwatched := ok && item.unwatchedLocked()
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotReferenced)
	}
	obj, err := c.lw.get(ctx, key.Namespace, key.Name)
	if unwatched && (err == nil || c.missing(err)) {
		if err == nil {
			item.store.put(obj, true) // a settled object's hook schedules its next read
		}
		if err != nil || !c.settling.settled(obj) {
			// Gone, or not settled: the re-read, in the context the
			// watches run in, watches it again (polls it in GET-only
			// mode).
			c.settling.queue.Add(key)
		}
	}
	if err != nil {
		return nil, err
	}
	return obj, nil
}

// reread reads an object that is not watched again: a settled object its
// period after its last read, a polled one (GET-only mode) at its poll.
func (c *byNameCache) reread(ctx context.Context, key cache.ObjectName) {
	c.mu.Lock()
	item, ok := c.items[key]
	due := ok && item.unwatchedLocked()
	c.mu.Unlock()
	if !due {
		return // unwatched, watched again meanwhile, or not read yet
	}
	obj, err := c.lw.get(ctx, key.Namespace, key.Name)
	c.afterRead(ctx, key, item, obj, err)
}

// afterRead takes what a GET of key's object returned while the object is
// not watched — a settled object's re-read, and in GET-only mode every
// read — and arranges the next: a settled object is read again a period
// later (its store's settle hook); a settled object whose read failed is
// kept as it was and read again a tenth of the period later; any other
// object is watched, or polled in GET-only mode (pollLocked). A missing
// object (c.missing) is cached as such; any other failure is the store's
// read error (objectStore.failed), which becomes a reason once it is
// final.
func (c *byNameCache) afterRead(ctx context.Context, key cache.ObjectName, item *watchItem, obj runtime.Object, err error) {
	missing := c.missing(err)
	if err != nil && !missing {
		c.mu.Lock()
		settled := item.settled
		c.mu.Unlock()
		if settled {
			klog.FromContext(ctx).V(4).Info("Reading a settled object failed; will retry", "kind", c.kind, "object", key, "err", err)
			c.settling.queue.AddAfter(key, c.settling.period/10)
			return
		}
		item.store.failed(err) // outside c.mu, as put below
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.items[key] == item && item.cancel == nil && ctx.Err() == nil {
			c.followLocked(ctx, key, item, nil, false, false)
		}
		return
	}
	if missing {
		obj = nil
	}
	// Outside c.mu: the change callback takes the Source's lock, which is
	// held while the Source calls watch (and so takes c.mu). The store's
	// settle hook schedules a settled object's next read.
	changed := item.store.put(obj, true)
	if obj != nil && c.settling.settled(obj) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.items[key] == item && item.cancel == nil && ctx.Err() == nil {
		c.followLocked(ctx, key, item, obj, obj == nil, changed)
	}
}

// followLocked follows an object that is not settled, missing (obj nil,
// missing set) or not read (obj nil): its reflector watches it, seeded
// with obj, or in GET-only mode it is polled; changed says that the read
// just made changed the cache (the poll starts over). c.mu must be held.
func (c *byNameCache) followLocked(ctx context.Context, key cache.ObjectName, item *watchItem, obj runtime.Object, missing, changed bool) {
	if c.getOnly {
		c.pollLocked(key, item, changed)
		return
	}
	c.startLocked(ctx, key, item, obj, missing)
}

// missing says whether a read that failed with err found the object
// missing: NotFound and, in GET-only mode, a VolumeAttachment's Forbidden.
// The Node authorizer answers Forbidden for a VolumeAttachment that is not
// related to the node in its graph, which cannot tell one that does not
// exist yet (the attach/detach controller has not made it) from one of
// another node; the kubelet waits for it as for a missing one, and so
// does the agent. A claim's or volume's Forbidden stays an error
// (objectStore.forbiddenMayPass).
func (c *byNameCache) missing(err error) bool {
	return apierrors.IsNotFound(err) || (c.getOnly && c.kind == KindVolumeAttachment && apierrors.IsForbidden(err))
}
