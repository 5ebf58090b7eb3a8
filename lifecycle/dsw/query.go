package dsw

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// HasPod tells whether the pod is known: SetPod was called for it and
// DeletePod was not. A known pod without uses wants no volume; an unknown
// pod wants nothing and its volumes may be torn down.
func (s *Store) HasPod(uid types.UID) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.pods[uid]
	return ok
}

// Pod returns the desired state of a known pod, with Uses sorted by Name and
// Errors by SpecName.
func (s *Store) Pod(uid types.UID) (Pod, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pe, ok := s.pods[uid]
	if !ok {
		return Pod{}, false
	}
	return Pod{
		Info:      pe.info,
		FirstSeen: pe.firstSeen,
		Uses:      sortedUses(pe.uses),
		Errors:    slices.Clone(pe.errors),
	}, true
}

// Pods returns the UIDs of all known pods, sorted.
func (s *Store) Pods() []types.UID {
	s.mu.RLock()
	defer s.mu.RUnlock()
	uids := make([]types.UID, 0, len(s.pods))
	for uid := range s.pods {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}

// PodErrors returns why some of the pod's volumes are not in the desired
// state, sorted by SpecName; none when all resolved or the pod is unknown.
func (s *Store) PodErrors(uid types.UID) []VolumeError {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pe, ok := s.pods[uid]
	if !ok {
		return nil
	}
	return slices.Clone(pe.errors)
}

// PodVolume returns a pod's use of a volume if the pod wants it.
func (s *Store) PodVolume(key volume.PodKey) (Use, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	pe, ok := s.pods[key.Pod]
	if !ok {
		return Use{}, false
	}
	u, ok := pe.uses[key.Volume]
	return u, ok
}

// Volume returns the volume-level Source of a volume some pod wants (the
// one staging uses), and whether any pod wants it.
func (s *Store) Volume(name volume.Name) (volume.Source, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ve, ok := s.volumes[name]
	if !ok {
		return volume.Source{}, false
	}
	return ve.source, true
}

// IsVolumeWanted tells whether any pod wants the volume.
func (s *Store) IsVolumeWanted(name volume.Name) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.volumes[name]
	return ok
}

// VolumePods returns the UIDs of the pods that want the volume, sorted.
func (s *Store) VolumePods(name volume.Name) []types.UID {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ve, ok := s.volumes[name]
	if !ok {
		return nil
	}
	uids := make([]types.UID, 0, len(ve.pods))
	for uid := range ve.pods {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}

// Volumes returns the names of all desired volumes, sorted.
func (s *Store) Volumes() []volume.Name {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]volume.Name, 0, len(s.volumes))
	for name := range s.volumes {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Counts returns the sizes of the desired state, for metrics.
func (s *Store) Counts() Counts {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c := Counts{
		Pods:               len(s.pods),
		Volumes:            len(s.volumes),
		PodVolumesByDriver: make(map[string]int),
	}
	for _, pe := range s.pods {
		for _, u := range pe.uses {
			c.PodVolumes++
			c.PodVolumesByDriver[u.Source.Driver]++
		}
	}
	return c
}

func sortedUses(uses map[volume.Name]Use) []Use {
	out := make([]Use, 0, len(uses))
	for _, u := range uses {
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b Use) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
