package volume

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func csiDriver(name string, mutate func(*storagev1.CSIDriverSpec)) *storagev1.CSIDriver {
	d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"}}
	if mutate != nil {
		mutate(&d.Spec)
	}
	return d
}

func TestDefaultPolicy(t *testing.T) {
	want := Policy{
		AttachRequired:       true,
		FSGroupPolicy:        storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy,
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
	}
	if diff := cmp.Diff(want, DefaultPolicy()); diff != "" {
		t.Errorf("DefaultPolicy() mismatch (-want +got):\n%s", diff)
	}
	if !DefaultPolicy().SupportsLifecycleMode(storagev1.VolumeLifecyclePersistent) {
		t.Error("DefaultPolicy() does not support Persistent volumes")
	}
	if DefaultPolicy().SupportsLifecycleMode(storagev1.VolumeLifecycleEphemeral) {
		t.Error("DefaultPolicy() supports Ephemeral volumes, want Persistent only")
	}
}

func TestPolicyFromCSIDriver(t *testing.T) {
	tests := map[string]struct {
		driver *storagev1.CSIDriver
		want   Policy
	}{
		"nil object gets defaults": {
			driver: nil,
			want:   DefaultPolicy(),
		},
		"all fields nil get API defaults": {
			driver: csiDriver("d", nil),
			want:   DefaultPolicy(),
		},
		"empty fsGroupPolicy gets default": {
			driver: csiDriver("d", func(s *storagev1.CSIDriverSpec) {
				s.FSGroupPolicy = ptr.To(storagev1.FSGroupPolicy(""))
			}),
			want: DefaultPolicy(),
		},
		"explicit values equal to defaults": {
			driver: csiDriver("d", func(s *storagev1.CSIDriverSpec) {
				s.AttachRequired = ptr.To(true)
				s.PodInfoOnMount = ptr.To(false)
				s.FSGroupPolicy = ptr.To(storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy)
				s.RequiresRepublish = ptr.To(false)
				s.SELinuxMount = ptr.To(false)
				s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
			}),
			want: DefaultPolicy(),
		},
		"every field set": {
			driver: csiDriver("d", func(s *storagev1.CSIDriverSpec) {
				s.AttachRequired = ptr.To(false)
				s.PodInfoOnMount = ptr.To(true)
				s.FSGroupPolicy = ptr.To(storagev1.FileFSGroupPolicy)
				s.RequiresRepublish = ptr.To(true)
				s.SELinuxMount = ptr.To(true)
				s.ServiceAccountTokenInSecrets = ptr.To(true)
				s.NodeAllocatableUpdatePeriodSeconds = ptr.To[int64](30)
				s.TokenRequests = []storagev1.TokenRequest{
					{Audience: "vault"},
					{Audience: "gcp", ExpirationSeconds: ptr.To[int64](3600)},
				}
				s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{
					storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral,
				}
			}),
			want: Policy{
				AttachRequired:               false,
				PodInfoOnMount:               true,
				FSGroupPolicy:                storagev1.FileFSGroupPolicy,
				RequiresRepublish:            true,
				SELinuxMount:                 true,
				ServiceAccountTokenInSecrets: true,
				NodeAllocatableUpdatePeriod:  30 * time.Second,
				TokenRequests: []storagev1.TokenRequest{
					{Audience: "vault"},
					{Audience: "gcp", ExpirationSeconds: ptr.To[int64](3600)},
				},
				VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{
					storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral,
				},
			},
		},
		"ephemeral only, fsGroup none, other fields nil": {
			driver: csiDriver("d", func(s *storagev1.CSIDriverSpec) {
				s.FSGroupPolicy = ptr.To(storagev1.NoneFSGroupPolicy)
				s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}
			}),
			want: Policy{
				AttachRequired:       true,
				FSGroupPolicy:        storagev1.NoneFSGroupPolicy,
				VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral},
			},
		},
		"non-positive allocatable update period means never": {
			driver: csiDriver("d", func(s *storagev1.CSIDriverSpec) {
				s.NodeAllocatableUpdatePeriodSeconds = ptr.To[int64](0)
			}),
			want: DefaultPolicy(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := PolicyFromCSIDriver(tc.driver)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("PolicyFromCSIDriver() mismatch (-want +got):\n%s", diff)
			}
			if !got.Equal(tc.want) {
				t.Errorf("Equal() = false for policies that cmp.Diff finds equal: %+v", got)
			}
		})
	}
}

func TestPolicyFromCSIDriverSharesNoMemory(t *testing.T) {
	d := csiDriver("d", func(s *storagev1.CSIDriverSpec) {
		s.TokenRequests = []storagev1.TokenRequest{{Audience: "a", ExpirationSeconds: ptr.To[int64](600)}}
		s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}
	})
	before := d.DeepCopy()

	p := PolicyFromCSIDriver(d)
	p.TokenRequests[0].Audience = "changed"
	*p.TokenRequests[0].ExpirationSeconds = 1
	p.VolumeLifecycleModes[0] = storagev1.VolumeLifecyclePersistent

	if diff := cmp.Diff(before, d); diff != "" {
		t.Errorf("modifying the Policy changed the CSIDriver object (-before +after):\n%s", diff)
	}
}

func TestPolicyEqual(t *testing.T) {
	base := func() Policy {
		p := DefaultPolicy()
		p.TokenRequests = []storagev1.TokenRequest{{Audience: "a", ExpirationSeconds: ptr.To[int64](600)}}
		return p
	}
	tests := map[string]struct {
		mutate func(*Policy)
		equal  bool
	}{
		"identical":               {mutate: func(*Policy) {}, equal: true},
		"attachRequired differs":  {mutate: func(p *Policy) { p.AttachRequired = false }},
		"podInfoOnMount differs":  {mutate: func(p *Policy) { p.PodInfoOnMount = true }},
		"fsGroupPolicy differs":   {mutate: func(p *Policy) { p.FSGroupPolicy = storagev1.FileFSGroupPolicy }},
		"republish differs":       {mutate: func(p *Policy) { p.RequiresRepublish = true }},
		"seLinuxMount differs":    {mutate: func(p *Policy) { p.SELinuxMount = true }},
		"tokenInSecrets differs":  {mutate: func(p *Policy) { p.ServiceAccountTokenInSecrets = true }},
		"update period differs":   {mutate: func(p *Policy) { p.NodeAllocatableUpdatePeriod = time.Minute }},
		"token audience differs":  {mutate: func(p *Policy) { p.TokenRequests[0].Audience = "b" }},
		"token expiry differs":    {mutate: func(p *Policy) { p.TokenRequests[0].ExpirationSeconds = ptr.To[int64](601) }},
		"token expiry nil":        {mutate: func(p *Policy) { p.TokenRequests[0].ExpirationSeconds = nil }},
		"token expiry equal copy": {mutate: func(p *Policy) { p.TokenRequests[0].ExpirationSeconds = ptr.To[int64](600) }, equal: true},
		"no tokens":               {mutate: func(p *Policy) { p.TokenRequests = nil }},
		"modes differ": {mutate: func(p *Policy) {
			p.VolumeLifecycleModes = append(p.VolumeLifecycleModes, storagev1.VolumeLifecycleEphemeral)
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a, b := base(), base()
			tc.mutate(&b)
			if got := a.Equal(b); got != tc.equal {
				t.Errorf("Equal() = %v, want %v", got, tc.equal)
			}
			if got := b.Equal(a); got != tc.equal {
				t.Errorf("Equal() reversed = %v, want %v", got, tc.equal)
			}
		})
	}
}
