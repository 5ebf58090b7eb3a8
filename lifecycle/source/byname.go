package source

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// minWatchTimeout is the by-name watches' minimum watch timeout. As in the
// kubelet's watch-based manager, it is raised from the reflector's default
// (5m) so that many small watches are not re-established too often.
const minWatchTimeout = 30 * time.Minute

// listWatchFuncs list and watch one kind in one namespace ("" for
// cluster-scoped kinds) with the given options.
type listWatchFuncs struct {
	list  func(ctx context.Context, namespace string, opts metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
	// client is the clientset, to tell the reflector whether it supports
	// watch-list semantics (fake clientsets do not).
	client any
}

// byNameCache caches the referenced objects of one kind, each through its
// own reflector with the field selector metadata.name=<name>: the kubelet's
// watch-based object manager (pkg/kubelet/util/manager), driven by
// reference counts kept by the Source instead of by pod registration.
type byNameCache struct {
	kind     Kind
	resource schema.GroupResource
	lw       listWatchFuncs
	expected runtime.Object
	// onChange is called with the key of an object that changed, was
	// deleted, or whose watch received its first list.
	onChange func(key cache.ObjectName)

	// mu protects ctx, stopped and items; wg counts running reflectors.
	mu sync.Mutex
	// ctx is set by run; until then watches are created but not started.
	ctx     context.Context
	stopped bool
	items   map[cache.ObjectName]*watchItem
	wg      sync.WaitGroup
}

type watchItem struct {
	store  *objectStore
	cancel context.CancelFunc // nil until the reflector runs
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
	}
}

// watch starts watching key (its first reference).
func (c *byNameCache) watch(key cache.ObjectName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[key]; ok {
		return
	}
	item := &watchItem{store: newObjectStore(key, func() { c.onChange(key) })}
	c.items[key] = item
	if c.ctx != nil && !c.stopped {
		c.startLocked(key, item)
	}
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

// startLocked runs the reflector of one object until its context ends.
func (c *byNameCache) startLocked(key cache.ObjectName, item *watchItem) {
	selector := fields.OneTermEqualSelector("metadata.name", key.Name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			return c.lw.list(ctx, key.Namespace, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			return c.lw.watch(ctx, key.Namespace, opts)
		},
	}
	logger := klog.FromContext(c.ctx)
	reflector := cache.NewReflectorWithOptions(
		cache.ToListWatcherWithWatchListSemantics(lw, c.lw.client),
		c.expected,
		item.store,
		cache.ReflectorOptions{
			Logger:          &logger,
			Name:            fmt.Sprintf("%s %s", c.kind, key),
			TypeDescription: string(c.kind),
			MinWatchTimeout: minWatchTimeout,
		},
	)
	ctx, cancel := context.WithCancel(c.ctx)
	item.cancel = cancel
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		reflector.RunWithContext(ctx)
	}()
}

// run starts the watches of every referenced object, and of objects
// referenced later, and stops them all when ctx ends. It blocks until all
// reflectors have returned.
func (c *byNameCache) run(ctx context.Context) {
	c.mu.Lock()
	c.ctx = ctx
	for key, item := range c.items {
		c.startLocked(key, item)
	}
	c.mu.Unlock()

	<-ctx.Done()
	c.mu.Lock()
	c.stopped = true
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
	obj, synced := item.store.get()
	if !synced {
		return nil, fmt.Errorf("%s %s: %w", c.kind, key, ErrNotSynced)
	}
	if obj == nil {
		return nil, apierrors.NewNotFound(c.resource, key.Name)
	}
	return obj, nil
}

// synced tells whether key is watched and its watch received its first list.
func (c *byNameCache) synced(key cache.ObjectName) bool {
	c.mu.Lock()
	item, ok := c.items[key]
	c.mu.Unlock()
	if !ok {
		return false
	}
	_, synced := item.store.get()
	return synced
}

func (c *byNameCache) hasSynced() bool { return true }

func (c *byNameCache) stats() (watches, objects int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, item := range c.items {
		if item.cancel != nil {
			watches++
		}
		if obj, _ := item.store.get(); obj != nil {
			objects++
		}
	}
	return watches, objects
}

// objectStore is the reflector store of one by-name watch: it keeps at most
// the one object whose key it was made for, and calls onChange after the
// object appeared, changed (a new resourceVersion) or disappeared, and after
// the first list, so that readers waiting for the sync are told. Resync
// echoes (the same resourceVersion again) are dropped. The objects come
// fresh from the decoder, so the store may strip their managedFields; it
// never changes them afterwards.
type objectStore struct {
	key      cache.ObjectName
	onChange func()

	// mu protects obj and synced.
	mu     sync.Mutex
	obj    runtime.Object
	synced bool
}

var _ cache.ReflectorStore = &objectStore{}

func newObjectStore(key cache.ObjectName, onChange func()) *objectStore {
	return &objectStore{key: key, onChange: onChange}
}

func (s *objectStore) get() (runtime.Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.obj, s.synced
}

// Add stores obj (reflector watch event Added).
func (s *objectStore) Add(obj any) error { s.put(obj, false); return nil }

// Update stores obj (reflector watch event Modified).
func (s *objectStore) Update(obj any) error { s.put(obj, false); return nil }

// Delete forgets the object (reflector watch event Deleted).
func (s *objectStore) Delete(obj any) error {
	if _, ok := s.match(obj); !ok {
		return nil
	}
	s.mu.Lock()
	changed := s.obj != nil && s.synced
	s.obj = nil
	s.mu.Unlock()
	if changed {
		s.onChange()
	}
	return nil
}

// Replace stores the result of a (re)list: the object, or none.
func (s *objectStore) Replace(list []any, _ string) error {
	var found any
	for _, obj := range list {
		if _, ok := s.match(obj); ok {
			found = obj
		}
	}
	s.put(found, true)
	return nil
}

// Resync does nothing: there is no queue to resync.
func (s *objectStore) Resync() error { return nil }

// put stores obj (nil: none); list marks the result of a list, which syncs
// the store.
func (s *objectStore) put(obj any, list bool) {
	var (
		ro runtime.Object
		rv string
	)
	if obj != nil {
		m, ok := s.match(obj)
		if !ok {
			return
		}
		if len(m.GetManagedFields()) > 0 {
			m.SetManagedFields(nil)
		}
		ro, _ = obj.(runtime.Object)
		rv = m.GetResourceVersion()
	}
	s.mu.Lock()
	wasSynced := s.synced
	changed := resourceVersion(s.obj) != rv || (s.obj == nil) != (ro == nil)
	s.obj = ro
	if list {
		s.synced = true
	}
	notify := s.synced && (changed || !wasSynced)
	s.mu.Unlock()
	if notify {
		s.onChange()
	}
}

// match returns obj's metadata if obj is the object this store is for.
// Field selectors make the API server send only that object; the check
// keeps a misbehaving server or a fake clientset from filling the store
// with others.
func (s *objectStore) match(obj any) (metav1.Object, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil || m.GetName() != s.key.Name || m.GetNamespace() != s.key.Namespace {
		return nil, false
	}
	if _, ok := obj.(runtime.Object); !ok {
		return nil, false
	}
	return m, true
}

func resourceVersion(obj runtime.Object) string {
	if obj == nil {
		return ""
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetResourceVersion()
}
