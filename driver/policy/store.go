package policy

import (
	"context"
	"errors"
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

// Interpret turns a driver's CSIDriver object into its policy P; a nil
// object (no CSIDriver for the driver) yields the defaults. It must not keep
// or modify the object, which belongs to the informer's cache.
type Interpret[P any] func(*storagev1.CSIDriver) P

// Store answers the policy of each driver from a CSIDriver informer's cache
// and tells subscribers when a driver's policy changes.
//
// Get reads the cache, so its answers are only authoritative once HasSynced
// returns true; before that a driver whose CSIDriver object is not yet cached
// gets the defaults. Callers wait for HasSynced (e.g. with
// cache.WaitForNamedCacheSyncWithContext) before acting on a policy, as the
// kubelet does in getCSIDriver.
type Store[P any] struct {
	lister       storagelisters.CSIDriverLister
	registration cache.ResourceEventHandlerRegistration
	logger       klog.Logger
	interpret    Interpret[P]
	equal        func(a, b P) bool

	// mu protects subscribers.
	mu          sync.Mutex
	subscribers []func(driverName string)
}

// New returns a Store backed by informer that interprets each CSIDriver with
// interpret and compares policies with equal, and registers its event
// handler on the informer. The informer may be started before or after New;
// the caller starts it (usually through its SharedInformerFactory). The
// logger for event handling is taken from ctx.
func New[P any](ctx context.Context, informer storageinformers.CSIDriverInformer, interpret Interpret[P], equal func(a, b P) bool) (*Store[P], error) {
	if interpret == nil || equal == nil {
		return nil, errors.New("policy: interpret and equal are required")
	}
	logger := klog.FromContext(ctx).WithName("policy")
	s := &Store[P]{
		lister:    informer.Lister(),
		logger:    logger,
		interpret: interpret,
		equal:     equal,
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

// Get returns the policy of the named driver: its CSIDriver object
// interpreted, or the interpretation of nil (the defaults) when there is no
// such object. See Store for when the answer is authoritative.
func (s *Store[P]) Get(driverName string) P {
	d, err := s.lister.Get(driverName)
	if err != nil {
		// An indexer-backed lister fails only with NotFound; anything else
		// would be a programming error, and the defaults are the safe answer
		// (attach required, nothing extra passed to the driver).
		if !apierrors.IsNotFound(err) {
			s.logger.Error(err, "Failed to read CSIDriver from cache, using defaults", "driver", driverName)
		}
		return s.interpret(nil)
	}
	return s.interpret(d)
}

// HasSynced tells whether the Store has seen the informer's initial list, so
// that Get answers from the API server's state.
func (s *Store[P]) HasSynced() bool {
	return s.registration.HasSynced()
}

// OnChange registers fn to be called with a driver's name whenever the
// policy that Get returns for that driver changes: a CSIDriver object with
// non-default settings is created or deleted, or an update changes its
// policy. Metadata-only updates and resync echoes are not reported.
//
// fn is called from the informer's event-handler goroutine, after the cache
// holds the new state; it must not block (enqueue work instead). Register
// subscribers before the informer starts to see the initial objects too.
func (s *Store[P]) OnChange(fn func(driverName string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subscribers = append(s.subscribers, fn)
}

func (s *Store[P]) notify(driverName string) {
	s.logger.V(4).Info("CSIDriver policy changed", "driver", driverName)
	s.mu.Lock()
	subscribers := slices.Clone(s.subscribers)
	s.mu.Unlock()
	for _, fn := range subscribers {
		fn(driverName)
	}
}

func (s *Store[P]) onAdd(obj any) {
	d, ok := obj.(*storagev1.CSIDriver)
	if !ok {
		s.logger.Error(nil, "Unexpected object in CSIDriver add event", "type", fmt.Sprintf("%T", obj))
		return
	}
	if !s.equal(s.interpret(d), s.interpret(nil)) {
		s.notify(d.Name)
	}
}

func (s *Store[P]) onUpdate(oldObj, newObj any) {
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
	if !s.equal(s.interpret(oldD), s.interpret(newD)) {
		s.notify(newD.Name)
	}
}

func (s *Store[P]) onDelete(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	d, ok := obj.(*storagev1.CSIDriver)
	if !ok {
		s.logger.Error(nil, "Unexpected object in CSIDriver delete event", "type", fmt.Sprintf("%T", obj))
		return
	}
	if !s.equal(s.interpret(d), s.interpret(nil)) {
		s.notify(d.Name)
	}
}
