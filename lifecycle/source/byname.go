package source

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// minWatchTimeout is the by-name watches' minimum watch timeout. As in the
// kubelet's watch-based manager, it is raised from the reflector's default
// (5m) so that many small watches are not re-established too often.
const minWatchTimeout = 30 * time.Minute

// listWatchFuncs get, list and watch one kind in one namespace ("" for
// cluster-scoped kinds).
type listWatchFuncs struct {
	get   func(ctx context.Context, namespace, name string) (runtime.Object, error)
	list  func(ctx context.Context, namespace string, opts metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
	// newList returns an empty list of the kind, for a GET's answer.
	newList func() runtime.Object
}

// byNameCache caches the referenced objects of one kind, each through its
// own reflector with the field selector metadata.name=<name>: the kubelet's
// watch-based object manager (pkg/kubelet/util/manager), driven by
// reference counts kept by the Source instead of by pod registration. In
// GET-only mode (getOnly) there are no reflectors: each object is read
// with GETs, polled until it settles (settle.go).
type byNameCache struct {
	kind     Kind
	resource schema.GroupResource
	lw       listWatchFuncs
	expected runtime.Object
	// onChange is called with the key of an object that changed, was
	// deleted, or whose watch received its first list.
	onChange func(key cache.ObjectName)

	// mu protects items; wg counts running reflectors.
	mu    sync.Mutex
	items map[cache.ObjectName]*watchItem
	wg    sync.WaitGroup
	// starts holds the keys whose reflector run is to start: run owns the
	// context the reflectors run in, watch only asks.
	starts workqueue.TypedInterface[cache.ObjectName]
	// settling, when set, ends the watch of an object that reached a state
	// in which no change is expected (settle.go); nil watches each object
	// for as long as it is referenced.
	settling *settling
	// getOnly reads with GETs only (Config.GetOnly): no bulk LIST, no
	// reflector; an object that is not settled is polled through
	// settling's queue. settling is then never nil.
	getOnly bool
}

type watchItem struct {
	store  *objectStore
	cancel context.CancelFunc // nil while no reflector runs
	// settled marks an object read and cached without a watch (settle.go);
	// until then it is watched, or about to be once its first read is in.
	settled bool
	// poll, in GET-only mode, is the interval before the next GET of an
	// object that is not settled (pollLocked); 0 before its first read and
	// once it settled.
	poll time.Duration
}

var _ objectCache = &byNameCache{}

func newByNameCache(kind Kind, resource schema.GroupResource, expected runtime.Object, lw listWatchFuncs,
	onChange func(cache.ObjectName)) *byNameCache {
	return &byNameCache{
		kind:     kind,
		resource: resource,
		lw:       lw,
		expected: expected,
		onChange: onChange,
		items:    make(map[cache.ObjectName]*watchItem),
		starts:   workqueue.NewTyped[cache.ObjectName](),
	}
}

// watch starts watching key (its first reference): run starts its
// reflector.
func (c *byNameCache) watch(key cache.ObjectName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[key]; ok {
		return
	}
	item := &watchItem{store: newObjectStore(key, func() { c.onChange(key) })}
	// The Node authorizer's Forbidden may be its graph lagging behind a
	// binding (missing covers VolumeAttachments).
	item.store.forbiddenMayPass = c.getOnly
	if c.settling != nil {
		item.store.onObject = func(obj runtime.Object) {
			if c.settling.settled(obj) {
				c.settle(key, item)
			}
		}
	}
	c.items[key] = item
	c.starts.Add(key)
}

// unwatch stops watching key (its last reference is gone).
func (c *byNameCache) unwatch(key cache.ObjectName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	item, ok := c.items[key]
	if !ok {
		return
	}
	delete(c.items, key)
	if item.cancel != nil {
		item.cancel()
	}
}

// startLocked runs the reflector of one object until ctx ends, the object
// is unwatched or it settles. seed, when not nil, is the object as a read
// just returned it: the reflector's first list, so that it is not read
// twice.
// startLocked starts key's reflector. seed, when set, is its first list;
// missing says that a GET just found no object, so the first list is a LIST
// at once (its resourceVersion is where the watch for the object's creation
// starts) rather than another GET.
func (c *byNameCache) startLocked(ctx context.Context, key cache.ObjectName, item *watchItem, seed runtime.Object, missing bool) {
	// Routine reflector lines (started, listing, caches populated, and
	// client-go's note that watch-list is off) are per object here: two
	// levels deeper than the reflectors of informers. Errors are not
	// affected by the level.
	logger := klog.FromContext(ctx).V(2)
	reflector := cache.NewReflectorWithOptions(
		&byNameListWatch{key: key, funcs: c.lw, seed: seed, listed: seed == nil && missing, failed: item.store.failed},
		c.expected,
		storeGeneration{s: item.store, gen: item.store.newGeneration()},
		cache.ReflectorOptions{
			Logger:          &logger,
			Name:            fmt.Sprintf("%s %s", c.kind, key),
			TypeDescription: string(c.kind),
			MinWatchTimeout: minWatchTimeout,
		},
	)
	runCtx, cancel := context.WithCancel(ctx)
	item.cancel, item.settled = cancel, false
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		reflector.RunWithContext(runCtx)
	}()
}

// run starts the watches of every referenced object, and of objects
// referenced later, and stops them all when ctx ends. It blocks until all
// reflectors have returned.
func (c *byNameCache) run(ctx context.Context) {
	reads := newFirstReads(c)
	var workers sync.WaitGroup
	workers.Go(func() { reads.run(ctx) })
	if c.settling != nil {
		workers.Go(func() { c.settling.run(ctx, c) })
	}
	go func() {
		<-ctx.Done()
		c.starts.ShutDown()
	}()
	for {
		key, shutdown := c.starts.Get()
		if shutdown {
			break
		}
		c.mu.Lock()
		if item, ok := c.items[key]; ok && item.cancel == nil && ctx.Err() == nil {
			reads.add(key)
		}
		c.mu.Unlock()
		c.starts.Done(key)
	}
	workers.Wait()

	c.mu.Lock()
	for _, item := range c.items {
		if item.cancel != nil {
			item.cancel()
		}
	}
	c.mu.Unlock()
	c.wg.Wait()
}

func (c *byNameCache) get(key cache.ObjectName) (runtime.Object, error) {
	c.mu.Lock()
	item, ok := c.items[key]
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotReferenced)
	}
	obj, synced, readErr := item.store.state(time.Now())
	switch {
	case !synced && readErr != nil:
		return nil, fmt.Errorf("reading %s %s failed: %w", c.kind, key, readErr)
	case !synced:
		return nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotSynced)
	}
	if obj == nil {
		return nil, apierrors.NewNotFound(c.resource, key.Name)
	}
	return obj, nil
}

func (c *byNameCache) hasSynced() bool { return true }

// stats counts as watches the objects watched or to be watched once read:
// none in GET-only mode.
func (c *byNameCache) stats() (watches, objects int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, item := range c.items {
		if !item.settled && !c.getOnly {
			watches++
		}
		if obj, _ := item.store.get(); obj != nil {
			objects++
		}
	}
	return watches, objects
}
