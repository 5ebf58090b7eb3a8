package dsw

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Store is the desired state of world. It is safe for concurrent use. The
// zero value is not usable; call New.
//
// Writers (the populator) replace a pod's whole desired state at once with
// SetPod, or remove it with DeletePod; the Store works out which volumes and
// uses changed and tells the subscribed Handlers. Readers (the reconciler,
// status, metrics) query by volume, by pod or by use; every query is O(1) or
// O(size of the answer) thanks to the index by pod.
type Store struct {
	// mu protects volumes, pods and handlers.
	mu sync.RWMutex
	// volumes indexes the desired volumes by name; an entry exists while at
	// least one pod uses the volume.
	volumes map[volume.Name]*volumeEntry
	// pods indexes the known pods by UID, including pods without volumes.
	pods     map[types.UID]*podEntry
	handlers []Handler
}

type volumeEntry struct {
	// source is the volume-level Source: the Source of the use that last
	// changed it (see pickSource).
	source volume.Source
	// sourceFrom is the pod whose use supplied source.
	sourceFrom types.UID
	// pods are the pods using the volume.
	pods map[types.UID]struct{}
}

type podEntry struct {
	info      volume.PodInfo
	firstSeen time.Time
	uses      map[volume.Name]Use
	errors    []VolumeError
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		volumes: make(map[volume.Name]*volumeEntry),
		pods:    make(map[types.UID]*podEntry),
	}
}

// Subscribe registers h. Register before the first SetPod to see every
// change; a Handler is never removed.
func (s *Store) Subscribe(h Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers = append(s.handlers, h)
}

// SetPod replaces the desired state of the pod p.Info.UID: its info, uses
// and errors. The pod becomes known even when it has no uses. Uses with the
// same Name replace one another (the last one stays); every Use's
// Volume.Pod.UID is set to the pod's UID. FirstSeen is kept from the pod's
// first SetPod that sets it. Handlers are told about every volume, use and pod that
// changed; a SetPod that changes nothing notifies nobody.
func (s *Store) SetPod(p Pod) {
	uid := p.Info.UID
	wanted := make(map[volume.Name]Use, len(p.Uses))
	for _, u := range p.Uses {
		u.Volume.Pod = p.Info
		wanted[u.Name] = u
	}
	errs := slices.Clone(p.Errors)
	slices.SortStableFunc(errs, func(a, b VolumeError) int { return cmp.Compare(a.SpecName, b.SpecName) })

	var ev events
	s.mu.Lock()
	pe, known := s.pods[uid]
	if !known {
		pe = &podEntry{info: p.Info, firstSeen: p.FirstSeen, uses: make(map[volume.Name]Use)}
		s.pods[uid] = pe
		ev.pod(uid)
	} else if pe.info != p.Info {
		pe.info = p.Info
		ev.pod(uid)
	}
	if pe.firstSeen.IsZero() {
		pe.firstSeen = p.FirstSeen
	}
	for name := range pe.uses {
		if _, ok := wanted[name]; !ok {
			s.removeUseLocked(pe, uid, name, &ev)
		}
	}
	for name, u := range wanted {
		s.putUseLocked(pe, uid, name, u, &ev)
	}
	if !slices.EqualFunc(pe.errors, errs, volumeErrorEqual) {
		pe.errors = errs
		ev.pod(uid)
	}
	handlers := s.handlers
	s.mu.Unlock()
	ev.deliver(handlers)
}

// DeletePod forgets the pod: its uses leave the desired state (volumes
// without any other pod leave with them) and the pod becomes unknown.
// Deleting an unknown pod does nothing.
func (s *Store) DeletePod(uid types.UID) {
	var ev events
	s.mu.Lock()
	pe, known := s.pods[uid]
	if known {
		for name := range pe.uses {
			s.removeUseLocked(pe, uid, name, &ev)
		}
		delete(s.pods, uid)
		ev.pod(uid)
	}
	handlers := s.handlers
	s.mu.Unlock()
	ev.deliver(handlers)
}

// putUseLocked adds or updates the use of volume name by pod uid.
func (s *Store) putUseLocked(pe *podEntry, uid types.UID, name volume.Name, u Use, ev *events) {
	if old, ok := pe.uses[name]; ok && old.equal(u) {
		return
	}
	pe.uses[name] = u
	ev.podVolume(u.Key())
	ev.pod(uid)

	ve, ok := s.volumes[name]
	if !ok {
		s.volumes[name] = &volumeEntry{
			source:     u.Source,
			sourceFrom: uid,
			pods:       map[types.UID]struct{}{uid: {}},
		}
		ev.volume(name)
		return
	}
	ve.pods[uid] = struct{}{}
	if !ve.source.Equal(u.Source) {
		// The newest resolution wins: a PersistentVolume update (e.g. its
		// capacity after expansion) reaches every pod this way.
		ve.source, ve.sourceFrom = u.Source, uid
		ev.volume(name)
	}
}

// removeUseLocked removes the use of volume name by pod uid.
func (s *Store) removeUseLocked(pe *podEntry, uid types.UID, name volume.Name, ev *events) {
	delete(pe.uses, name)
	ev.podVolume(volume.PodKey{Volume: name, Pod: uid})
	ev.pod(uid)

	ve, ok := s.volumes[name]
	if !ok {
		return
	}
	delete(ve.pods, uid)
	if len(ve.pods) == 0 {
		delete(s.volumes, name)
		ev.volume(name)
		return
	}
	if ve.sourceFrom == uid {
		s.pickSourceLocked(name, ve, ev)
	}
}

// pickSourceLocked makes the volume-level Source that of the remaining pod
// with the smallest UID, so that the choice does not depend on map order.
func (s *Store) pickSourceLocked(name volume.Name, ve *volumeEntry, ev *events) {
	var from types.UID
	first := true
	for uid := range ve.pods {
		if first || uid < from {
			from, first = uid, false
		}
	}
	src := s.pods[from].uses[name].Source
	ve.sourceFrom = from
	if !ve.source.Equal(src) {
		ve.source = src
		ev.volume(name)
	}
}

func volumeErrorEqual(a, b VolumeError) bool {
	if a.SpecName != b.SpecName {
		return false
	}
	if a.Err == nil || b.Err == nil {
		return a.Err == nil && b.Err == nil
	}
	return a.Err.Error() == b.Err.Error()
}

// events collects the keys a change touched, each once, in order.
type events struct {
	volumes    []volume.Name
	podVolumes []volume.PodKey
	pods       []types.UID
}

func (e *events) volume(name volume.Name) {
	if !slices.Contains(e.volumes, name) {
		e.volumes = append(e.volumes, name)
	}
}

func (e *events) podVolume(key volume.PodKey) {
	if !slices.Contains(e.podVolumes, key) {
		e.podVolumes = append(e.podVolumes, key)
	}
}

func (e *events) pod(uid types.UID) {
	if !slices.Contains(e.pods, uid) {
		e.pods = append(e.pods, uid)
	}
}

// deliver calls the handlers: volumes first, then uses, then pods, so that a
// subscriber that keys on the pod sees the volumes' state already changed.
func (e *events) deliver(handlers []Handler) {
	for _, h := range handlers {
		if h.Volume != nil {
			for _, name := range e.volumes {
				h.Volume(name)
			}
		}
		if h.PodVolume != nil {
			for _, key := range e.podVolumes {
				h.PodVolume(key)
			}
		}
		if h.Pod != nil {
			for _, uid := range e.pods {
				h.Pod(uid)
			}
		}
	}
}
