package volume

import (
	"maps"
	"slices"
)

// Equal tells whether two Sources describe the same volume with the same
// parameters. A nil and an empty slice or map are equal; SecretRefs are
// compared by value.
func (s Source) Equal(o Source) bool {
	return s.ID == o.ID &&
		s.Inline == o.Inline &&
		slices.Equal(s.AccessModes, o.AccessModes) &&
		s.FSType == o.FSType &&
		slices.Equal(s.MountOptions, o.MountOptions) &&
		maps.Equal(s.Attributes, o.Attributes) &&
		secretRefEqual(s.StageSecret, o.StageSecret) &&
		secretRefEqual(s.PublishSecret, o.PublishSecret) &&
		secretRefEqual(s.ExpandSecret, o.ExpandSecret) &&
		s.CapacityBytes == o.CapacityBytes &&
		s.SELinuxContext == o.SELinuxContext &&
		int64PtrEqual(s.GID, o.GID)
}

// Equal tells whether two PodVolumes describe the same use of a volume by the
// same pod. FSGroup is compared by value.
func (p PodVolume) Equal(o PodVolume) bool {
	return p.Pod == o.Pod &&
		p.SpecName == o.SpecName &&
		p.ReadOnly == o.ReadOnly &&
		int64PtrEqual(p.FSGroup, o.FSGroup) &&
		ptrEqual(p.FSGroupChangePolicy, o.FSGroupChangePolicy)
}

func ptrEqual[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func secretRefEqual(a, b *SecretRef) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func int64PtrEqual(a, b *int64) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}
