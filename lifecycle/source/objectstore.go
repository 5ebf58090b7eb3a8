package source

import (
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// objectStore is the reflector store of one by-name watch: it keeps at most
// the one object whose key it was made for, and calls onChange after the
// object appeared, changed (a new resourceVersion) or disappeared, and after
// the first list, so that readers waiting for the sync are told. Resync
// echoes (the same resourceVersion again) are dropped. The store keeps a
// copy without managedFields of an object that has them, and never changes
// an object it stores.
type objectStore struct {
	key      cache.ObjectName
	onChange func()
	// onObject, when set, is told every object stored (the settle rule).
	onObject func(runtime.Object)
	// forbiddenMayPass makes Forbidden an error that may pass (unreadable
	// after unreadableAfter) rather than a final one: GET-only mode, where
	// the Node authorizer forbids a claim or volume until its graph has
	// related it to the node, up to a second after the binding. Set before
	// the store is used.
	forbiddenMayPass bool

	// mu protects obj, synced, the read failure and gen.
	mu     sync.Mutex
	obj    runtime.Object
	synced bool
	// readErr is why the last read (the first GET, or a list of the
	// reflector) failed while the store is not synced: an error other
	// than NotFound. failingSince is when the reads began to fail. A
	// list clears both.
	readErr      error
	failingSince time.Time
	// toldUnreadable is set once the readers were told the object is
	// unreadable.
	toldUnreadable bool
	// gen counts the reflectors started on the store; only the newest
	// may write (storeGeneration).
	gen uint64
}

// newGeneration starts a generation of writers: those of older ones are
// dropped from now on. It returns the new generation.
func (s *objectStore) newGeneration() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	return s.gen
}

func (s *objectStore) current(gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen == gen
}

// storeGeneration is the store as one reflector writes it: once a newer
// reflector started, or the object settled and its watch ended, what a
// reflector still delivers is dropped.
type storeGeneration struct {
	s   *objectStore
	gen uint64
}

var _ cache.ReflectorStore = storeGeneration{}

func (g storeGeneration) Add(obj any) error {
	if g.s.current(g.gen) {
		return g.s.Add(obj)
	}
	return nil
}

func (g storeGeneration) Update(obj any) error {
	if g.s.current(g.gen) {
		return g.s.Update(obj)
	}
	return nil
}

func (g storeGeneration) Delete(obj any) error {
	if g.s.current(g.gen) {
		return g.s.Delete(obj)
	}
	return nil
}

func (g storeGeneration) Replace(list []any, rv string) error {
	if g.s.current(g.gen) {
		return g.s.Replace(list, rv)
	}
	return nil
}

func (g storeGeneration) Resync() error { return nil }

var _ cache.ReflectorStore = &objectStore{}

func newObjectStore(key cache.ObjectName, onChange func()) *objectStore {
	return &objectStore{key: key, onChange: onChange}
}

func (s *objectStore) get() (runtime.Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.obj, s.synced
}

// state returns the object, whether the store is synced and, while it is
// not, why the object cannot be read: the last read's error once it is
// reportable at now (unreadable), nil while the object may still be on
// its way.
func (s *objectStore) state(now time.Time) (runtime.Object, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readErr != nil && s.unreadable(s.readErr, now.Sub(s.failingSince)) {
		return s.obj, s.synced, s.readErr
	}
	return s.obj, s.synced, nil
}

// failed records that reading the object failed with err (not NotFound).
// A synced store keeps the object it has; one not synced yet reports err
// once it is reportable (unreadable), and its readers hear of that then,
// and of the list that ends the failures.
func (s *objectStore) failed(err error) {
	now := time.Now()
	s.mu.Lock()
	if s.synced {
		s.mu.Unlock()
		return
	}
	if s.readErr == nil {
		s.failingSince = now
	}
	s.readErr = err
	tell := !s.toldUnreadable && s.unreadable(err, now.Sub(s.failingSince))
	if tell {
		s.toldUnreadable = true
	}
	s.mu.Unlock()
	if tell {
		s.onChange()
	}
}

// unreadableAfter is how long reads of an object may fail with an error
// that may pass (the API server unreachable, overloaded, timing out)
// before the object counts as unreadable. Meanwhile a pod that references
// it waits, and keeps the node from settling: after an API server outage
// its claim may want a volume that looks unwanted.
const unreadableAfter = 30 * time.Second

// unreadable tells whether reads that have failed for failingFor, the
// last with err, make the object unreadable: at once for the API
// server's final answers (Forbidden and the like: the request, not the
// server, is at fault), after unreadableAfter for any other error.
func unreadable(err error, failingFor time.Duration) bool {
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsBadRequest(err),
		apierrors.IsInvalid(err), apierrors.IsMethodNotSupported(err), apierrors.IsNotAcceptable(err),
		apierrors.IsUnsupportedMediaType(err):
		return true
	}
	return failingFor >= unreadableAfter
}

// unreadable is unreadable for this store: with forbiddenMayPass,
// Forbidden too becomes final only after unreadableAfter.
func (s *objectStore) unreadable(err error, failingFor time.Duration) bool {
	if s.forbiddenMayPass && apierrors.IsForbidden(err) {
		return failingFor >= unreadableAfter
	}
	return unreadable(err, failingFor)
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

// put stores obj (nil: none); list marks the result of a list (or of a
// GET), which syncs the store. It tells whether the readers were told: the
// object changed, appeared or disappeared in a synced store, or the store
// just synced.
func (s *objectStore) put(obj any, list bool) bool {
	var (
		ro runtime.Object
		rv string
	)
	if obj != nil {
		m, ok := s.match(obj)
		if !ok {
			return false
		}
		ro, _ = obj.(runtime.Object)
		rv = m.GetResourceVersion()
		if len(m.GetManagedFields()) > 0 {
			// Stripped on a copy: the reflector's object may be shared
			// (fake clientsets hand the same object to every watcher).
			ro = ro.DeepCopyObject()
			if cm, err := meta.Accessor(ro); err == nil {
				cm.SetManagedFields(nil)
			}
		}
	}
	s.mu.Lock()
	wasSynced := s.synced
	changed := resourceVersion(s.obj) != rv || (s.obj == nil) != (ro == nil)
	s.obj = ro
	if list {
		s.synced = true
		s.readErr, s.failingSince, s.toldUnreadable = nil, time.Time{}, false
	}
	notify := s.synced && (changed || !wasSynced)
	s.mu.Unlock()
	if notify {
		s.onChange()
	}
	if ro != nil && s.onObject != nil {
		s.onObject(ro)
	}
	return notify
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
