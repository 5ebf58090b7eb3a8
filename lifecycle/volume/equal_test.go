package volume

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestSourceEqualFields(t *testing.T) {
	base := func() Source {
		return Source{
			ID:           ID{Driver: "d", Handle: "h", PVName: "pv", AccessType: Filesystem},
			AccessModes:  []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			FSType:       "ext4",
			MountOptions: []string{"ro"},
			Attributes:   map[string]string{"a": "b"},
			StageSecret:  &SecretRef{Namespace: "ns", Name: "s"},
		}
	}
	for name, tc := range map[string]struct {
		change func(*Source)
		equal  bool
	}{
		"identical":                  {change: func(*Source) {}, equal: true},
		"secret ref by value":        {change: func(s *Source) { s.StageSecret = &SecretRef{Namespace: "ns", Name: "s"} }, equal: true},
		"attributes emptied":         {change: func(s *Source) { s.Attributes = map[string]string{} }},
		"handle":                     {change: func(s *Source) { s.Handle = "x" }},
		"pv name":                    {change: func(s *Source) { s.PVName = "x" }},
		"access mode":                {change: func(s *Source) { s.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany} }},
		"mount options":              {change: func(s *Source) { s.MountOptions = nil }},
		"attribute value":            {change: func(s *Source) { s.Attributes = map[string]string{"a": "c"} }},
		"stage secret removed":       {change: func(s *Source) { s.StageSecret = nil }},
		"publish secret added":       {change: func(s *Source) { s.PublishSecret = &SecretRef{Name: "p"} }},
		"capacity":                   {change: func(s *Source) { s.CapacityBytes = 1 }},
		"selinux context":            {change: func(s *Source) { s.SELinuxContext = "system_u:object_r:container_file_t:s0:c1,c2" }},
		"gid":                        {change: func(s *Source) { g := int64(1); s.GID = &g }},
		"access type":                {change: func(s *Source) { s.AccessType = Block }},
		"inline":                     {change: func(s *Source) { s.Inline = true }},
		"fsType":                     {change: func(s *Source) { s.FSType = "xfs" }},
		"expand secret name differs": {change: func(s *Source) { s.ExpandSecret = &SecretRef{Name: "e"} }},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := base(), base()
			tc.change(&b)
			if got := a.Equal(b); got != tc.equal {
				t.Errorf("Equal = %v, want %v", got, tc.equal)
			}
			if got := b.Equal(a); got != tc.equal {
				t.Errorf("Equal is not symmetric")
			}
		})
	}
	empty := Source{}
	if !empty.Equal(Source{Attributes: map[string]string{}, MountOptions: []string{}}) {
		t.Error("nil and empty slices and maps must be equal")
	}
}

func TestPodVolumeEqual(t *testing.T) {
	g1, g2 := int64(1), int64(1)
	a := PodVolume{Pod: PodInfo{UID: "u"}, SpecName: "v", FSGroup: &g1}
	b := PodVolume{Pod: PodInfo{UID: "u"}, SpecName: "v", FSGroup: &g2}
	if !a.Equal(b) {
		t.Error("FSGroup must be compared by value")
	}
	b.FSGroup = nil
	if a.Equal(b) {
		t.Error("nil and set FSGroup compare equal")
	}
	b.FSGroup, b.ReadOnly = &g2, true
	if a.Equal(b) {
		t.Error("ReadOnly ignored")
	}
}
