package policy

import (
	"context"
	"fmt"
	"slices"
	"sync"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Store answers the Policy of each driver from a CSIDriver informer's cache
// and tells subscribers when a driver's Policy changes.
//
// Get reads the cache, so its answers are only authoritative once HasSynced
// returns true; before that a driver whose CSIDriver object is not yet cached
// gets Default(). Callers wait for HasSynced (e.g. with
// cache.WaitForNamedCacheSyncWithContext) before acting on a Policy, as the
// kubelet does in getCSIDriver.
type Store struct {
	lister       storagelisters.CSIDriverLister
	registration cache.ResourceEventHandlerRegistration
	logger       klog.Logger

	// mu protects subscribers.
	mu          sync.Mutex
	subscribers []func(driverName string)
}

// New returns a Store backed by informer and registers its event handler on
// the informer. The informer may be started before or after New; the caller
// starts it (usually through its SharedInformerFactory). The logger for
// event handling is taken from ctx.
func New(ctx context.Context, informer storageinformers.CSIDriverInformer) (*Store, error) {
	logger := klog.FromContext(ctx).WithName("policy")
	s := &Store{
		lister: informer.Lister(),
		logger: logger,
	}
	reg, err := informer.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.onAdd,
		UpdateFunc: s.onUpdate,
		DeleteFunc: s.onDelete,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding CSIDriver event handler: %w", err)
	}
	s.registration = reg
	return s, nil
}

// Get returns the Policy of the named driver: the one its CSIDriver object
// configures, or Default() when there is no such object. See Store for when
// the answer is authoritative.
func (s *Store) Get(driverName string) Policy {
	d, err := s.lister.Get(driverName)
	if err != nil {
		// An indexer-backed lister fails only with NotFound; anything else
		// would be a programming error, and the defaults are the safe answer
		// (attach required, nothing extra passed to the driver).
		if !apierrors.IsNotFound(err) {
			s.logger.Error(err, "Failed to read CSIDriver from cache, using defaults", "driver", driverName)
		}
		return Default()
	}
	return FromCSIDriver(d)
}

// HasSynced tells whether the Store has seen the informer's initial list, so
// that Get answers from the API server's state.
func (s *Store) HasSynced() bool {
	return s.registration.HasSynced()
}

// OnChange registers fn to be called with a driver's name whenever the Policy
// that Get returns for that driver changes: a CSIDriver object with
// non-default settings is created or deleted, or an update changes its
// Policy. Metadata-only updates and resync echoes are not reported.
//
// fn is called from the informer's event-handler goroutine, after the cache
// holds the new state; it must not block (enqueue work instead). Register
// subscribers before the informer starts to see the initial objects too.
func (s *Store) OnChange(fn func(driverName string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subscribers = append(s.subscribers, fn)
}

func (s *Store) notify(driverName string) {
	s.logger.V(4).Info("CSIDriver policy changed", "driver", driverName)
	s.mu.Lock()
	subscribers := slices.Clone(s.subscribers)
	s.mu.Unlock()
	for _, fn := range subscribers {
		fn(driverName)
	}
}

func (s *Store) onAdd(obj any) {
	d, ok := obj.(*storagev1.CSIDriver)
	if !ok {
		s.logger.Error(nil, "Unexpected object in CSIDriver add event", "type", fmt.Sprintf("%T", obj))
		return
	}
	if !FromCSIDriver(d).Equal(Default()) {
		s.notify(d.Name)
	}
}

func (s *Store) onUpdate(oldObj, newObj any) {
	oldD, ok := oldObj.(*storagev1.CSIDriver)
	if !ok {
		s.logger.Error(nil, "Unexpected object in CSIDriver update event", "type", fmt.Sprintf("%T", oldObj))
		return
	}
	newD, ok := newObj.(*storagev1.CSIDriver)
	if !ok {
		s.logger.Error(nil, "Unexpected object in CSIDriver update event", "type", fmt.Sprintf("%T", newObj))
		return
	}
	if oldD.ResourceVersion == newD.ResourceVersion {
		// Periodic resync delivers the same object again.
		return
	}
	if !FromCSIDriver(oldD).Equal(FromCSIDriver(newD)) {
		s.notify(newD.Name)
	}
}

func (s *Store) onDelete(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	d, ok := obj.(*storagev1.CSIDriver)
	if !ok {
		s.logger.Error(nil, "Unexpected object in CSIDriver delete event", "type", fmt.Sprintf("%T", obj))
		return
	}
	if !FromCSIDriver(d).Equal(Default()) {
		s.notify(d.Name)
	}
}
