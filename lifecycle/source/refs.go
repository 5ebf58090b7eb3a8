package source

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// AddReferences adds refs to the objects the pod references, keeping the
// ones it already has. The populator calls it while it resolves a pod, as
// it learns what the pod needs (claims first, then the volumes they are
// bound to), before reading them. Objects that get their first reference
// start being watched.
func (s *Source) AddReferences(pod types.UID, refs References) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(pod, refKeys(refs), refs.Attachments)
}

// SetReferences replaces the objects the pod references with refs: objects
// it no longer references lose the reference, and stop being watched when
// it was their last one. SetReferences(pod, References{}) releases all of a
// pod's references; the populator calls it when the pod leaves.
func (s *Source) SetReferences(pod types.UID, refs References) {
	want := refKeys(refs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if pr := s.refs[pod]; pr != nil {
		for key := range pr.keys {
			if _, ok := want[key]; !ok {
				delete(pr.keys, key)
				s.removeUserLocked(key, pod)
			}
		}
		clear(pr.attachVolumes)
	}
	if len(want) == 0 {
		delete(s.refs, pod)
		return
	}
	s.addLocked(pod, want, refs.Attachments)
}

func (s *Source) addLocked(pod types.UID, keys map[refKey]struct{}, attachments []Attachment) {
	if len(keys) == 0 {
		return
	}
	pr := s.refs[pod]
	if pr == nil {
		pr = &podRefs{keys: make(map[refKey]struct{}), attachVolumes: make(map[string][]volume.Name)}
		s.refs[pod] = pr
	}
	for key := range keys {
		if _, ok := pr.keys[key]; ok {
			continue
		}
		pr.keys[key] = struct{}{}
		s.addUserLocked(key, pod)
	}
	for _, a := range attachments {
		if a.Name != "" && !slices.Contains(pr.attachVolumes[a.Name], a.Volume) {
			pr.attachVolumes[a.Name] = append(pr.attachVolumes[a.Name], a.Volume)
		}
	}
}

// References returns the objects the pod references, for tests and
// debugging; slices are sorted.
func (s *Source) References(pod types.UID) References {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out References
	pr := s.refs[pod]
	if pr == nil {
		return out
	}
	for key := range pr.keys {
		switch key.kind {
		case KindPersistentVolumeClaim:
			out.PVCs = append(out.PVCs, key.name)
		case KindPersistentVolume:
			out.PVs = append(out.PVs, key.name.Name)
		case KindVolumeAttachment:
			for _, v := range pr.attachVolumes[key.name.Name] {
				out.Attachments = append(out.Attachments, Attachment{Name: key.name.Name, Volume: v})
			}
		}
	}
	slices.SortFunc(out.PVCs, func(a, b cache.ObjectName) int { return cmp.Compare(a.String(), b.String()) })
	slices.Sort(out.PVs)
	slices.SortFunc(out.Attachments, func(a, b Attachment) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Volume, b.Volume))
	})
	return out
}

func (s *Source) addUserLocked(key refKey, pod types.UID) {
	users := s.users[key]
	if users == nil {
		users = make(map[types.UID]struct{})
		s.users[key] = users
	}
	users[pod] = struct{}{}
	if len(users) == 1 {
		s.caches[key.kind].watch(key.name)
	}
}

func (s *Source) removeUserLocked(key refKey, pod types.UID) {
	users := s.users[key]
	delete(users, pod)
	if len(users) == 0 {
		delete(s.users, key)
		s.caches[key.kind].unwatch(key.name)
	}
}

// refKeys returns the keys of refs, skipping empty names (a pod spec with
// missing fields must not make the Source watch a whole kind).
func refKeys(refs References) map[refKey]struct{} {
	keys := make(map[refKey]struct{}, len(refs.PVCs)+len(refs.PVs)+len(refs.Attachments))
	for _, n := range refs.PVCs {
		if n.Name != "" && n.Namespace != "" {
			keys[refKey{kind: KindPersistentVolumeClaim, name: n}] = struct{}{}
		}
	}
	for _, n := range refs.PVs {
		if n != "" {
			keys[refKey{kind: KindPersistentVolume, name: cache.ObjectName{Name: n}}] = struct{}{}
		}
	}
	for _, a := range refs.Attachments {
		if a.Name != "" {
			keys[refKey{kind: KindVolumeAttachment, name: cache.ObjectName{Name: a.Name}}] = struct{}{}
		}
	}
	return keys
}
