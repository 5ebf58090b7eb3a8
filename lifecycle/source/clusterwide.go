package source

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// objectCache is the cache of one kind of referenced object: by name
// (byNameCache) or, as an explicit option for small clusters, through a
// cluster-wide informer (informerCache).
type objectCache interface {
	// watch is called when key gets its first reference.
	watch(key cache.ObjectName)
	// unwatch is called when key loses its last reference.
	unwatch(key cache.ObjectName)
	// get returns the cached object; errors: ErrNotReferenced,
	// ErrNotSynced, or the API's NotFound.
	get(key cache.ObjectName) (runtime.Object, error)
	// hasSynced tells whether the cache as a whole has synced.
	hasSynced() bool
	// stats returns the number of open watches and cached objects.
	stats() (watches, objects int)
}

// informerCache serves a kind from a cluster-wide informer: every object of
// the kind is cached, whether referenced or not. Only for small clusters
// (Config.ClusterWideInformers).
type informerCache struct {
	resource schema.GroupResource
	informer cache.SharedIndexInformer
	reg      cache.ResourceEventHandlerRegistration
}

var _ objectCache = &informerCache{}

// newInformerCache registers onChange on informer for every add, update
// with a new resourceVersion, and delete.
func newInformerCache(logger klog.Logger, kind Kind, resource schema.GroupResource, informer cache.SharedIndexInformer,
	onChange func(cache.ObjectName)) (*informerCache, error) {
	c := &informerCache{resource: resource, informer: informer}
	notify := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
			if obj == nil {
				if key, err := cache.ParseObjectName(tomb.Key); err == nil {
					onChange(key)
				}
				return
			}
		}
		key, err := cache.ObjectToName(obj)
		if err != nil {
			logger.Error(err, "Unexpected object in event", "kind", kind, "type", fmt.Sprintf("%T", obj))
			return
		}
		onChange(key)
	}
	reg, err := informer.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: notify,
		UpdateFunc: func(oldObj, newObj any) {
			if resourceVersionOf(oldObj) == resourceVersionOf(newObj) {
				return // resync echo
			}
			notify(newObj)
		},
		DeleteFunc: notify,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding %s event handler: %w", kind, err)
	}
	c.reg = reg
	return c, nil
}

func (c *informerCache) watch(cache.ObjectName)   {}
func (c *informerCache) unwatch(cache.ObjectName) {}

func (c *informerCache) get(key cache.ObjectName) (runtime.Object, error) {
	if !c.reg.HasSynced() {
		return nil, fmt.Errorf("%s %s: %w", c.resource, key, ErrNotSynced)
	}
	obj, exists, err := c.informer.GetIndexer().GetByKey(key.String())
	if err != nil {
		return nil, fmt.Errorf("reading %s %s from cache: %w", c.resource, key, err)
	}
	if !exists {
		return nil, apierrors.NewNotFound(c.resource, key.Name)
	}
	ro, ok := obj.(runtime.Object)
	if !ok {
		return nil, fmt.Errorf("unexpected %T in %s cache", obj, c.resource)
	}
	return ro, nil
}

func (c *informerCache) hasSynced() bool { return c.reg.HasSynced() }

func (c *informerCache) stats() (watches, objects int) {
	return 1, len(c.informer.GetIndexer().ListKeys())
}

func resourceVersionOf(obj any) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetResourceVersion()
}

// stripManagedFields drops managedFields before objects enter an informer's
// cache: the agent never reads them and they are a large share of an
// object's memory.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil && len(m.GetManagedFields()) > 0 {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
