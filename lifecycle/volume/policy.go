package volume

import (
	"slices"
	"time"

	storagev1 "k8s.io/api/storage/v1"
)

// Policy is the node-side behaviour of one CSI driver, as configured by its
// CSIDriver object or by the kubelet's defaults when there is none.
//
// Policy is a value that shares no memory with the object it came from, so a
// caller may keep it or modify it.
type Policy struct {
	// AttachRequired tells whether a volume of this driver must be attached
	// (a VolumeAttachment with status.attached=true must exist) before it is
	// staged. Default: true.
	AttachRequired bool
	// PodInfoOnMount tells whether NodePublishVolume receives the pod's name,
	// namespace, UID, service account name and ephemeral flag in its volume
	// context. Default: false.
	PodInfoOnMount bool
	// FSGroupPolicy tells whether and how the volume's ownership and
	// permissions are changed to the pod's fsGroup.
	// Default: ReadWriteOnceWithFSType.
	FSGroupPolicy storagev1.FSGroupPolicy
	// RequiresRepublish tells whether NodePublishVolume is called periodically
	// for an already published volume (e.g. to refresh tokens). Default: false.
	RequiresRepublish bool
	// SELinuxMount tells whether the driver supports the -o context mount
	// option, so that the pod's SELinux label can be applied at mount time.
	// Default: false.
	SELinuxMount bool
	// ServiceAccountTokenInSecrets tells whether the service account tokens
	// from TokenRequests are passed in NodePublishVolume's secrets field
	// instead of its volume context. Default: false.
	ServiceAccountTokenInSecrets bool
	// TokenRequests lists the audiences for which a service account token of
	// the pod is requested and passed on NodePublishVolume. Default: none.
	TokenRequests []storagev1.TokenRequest
	// VolumeLifecycleModes lists the lifecycle modes the driver supports; it
	// is never empty. Default: [Persistent].
	VolumeLifecycleModes []storagev1.VolumeLifecycleMode
	// NodeAllocatableUpdatePeriod is how often the driver's node allocatable
	// (max volumes) should be refreshed with NodeGetInfo; zero means never.
	// Default: 0.
	NodeAllocatableUpdatePeriod time.Duration
}

// DefaultPolicy returns the policy of a driver that has no CSIDriver object. It
// matches the kubelet (pkg/volume/csi): attach required, no pod info, fsGroup
// applied only to ReadWriteOnce volumes with an fsType, Persistent volumes
// only, no republish, no SELinux mount, no token requests.
func DefaultPolicy() Policy {
	return Policy{
		AttachRequired:       true,
		PodInfoOnMount:       false,
		FSGroupPolicy:        storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy,
		RequiresRepublish:    false,
		SELinuxMount:         false,
		VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
	}
}

// PolicyFromCSIDriver returns the policy a CSIDriver object configures. A
// nil object yields DefaultPolicy(). Fields that are unset (nil pointers, empty lists,
// an empty fsGroupPolicy) get the same defaults the API server would apply,
// so an object read from a manifest behaves like one read from the API.
// The returned Policy shares no memory with d.
func PolicyFromCSIDriver(d *storagev1.CSIDriver) Policy {
	p := DefaultPolicy()
	if d == nil {
		return p
	}
	spec := &d.Spec
	if spec.AttachRequired != nil {
		p.AttachRequired = *spec.AttachRequired
	}
	if spec.PodInfoOnMount != nil {
		p.PodInfoOnMount = *spec.PodInfoOnMount
	}
	if spec.FSGroupPolicy != nil && *spec.FSGroupPolicy != "" {
		p.FSGroupPolicy = *spec.FSGroupPolicy
	}
	if spec.RequiresRepublish != nil {
		p.RequiresRepublish = *spec.RequiresRepublish
	}
	if spec.SELinuxMount != nil {
		p.SELinuxMount = *spec.SELinuxMount
	}
	if spec.ServiceAccountTokenInSecrets != nil {
		p.ServiceAccountTokenInSecrets = *spec.ServiceAccountTokenInSecrets
	}
	if len(spec.TokenRequests) > 0 {
		p.TokenRequests = make([]storagev1.TokenRequest, len(spec.TokenRequests))
		for i := range spec.TokenRequests {
			spec.TokenRequests[i].DeepCopyInto(&p.TokenRequests[i])
		}
	}
	if len(spec.VolumeLifecycleModes) > 0 {
		p.VolumeLifecycleModes = slices.Clone(spec.VolumeLifecycleModes)
	}
	if spec.NodeAllocatableUpdatePeriodSeconds != nil && *spec.NodeAllocatableUpdatePeriodSeconds > 0 {
		p.NodeAllocatableUpdatePeriod = time.Duration(*spec.NodeAllocatableUpdatePeriodSeconds) * time.Second
	}
	return p
}

// SupportsLifecycleMode tells whether the driver accepts volumes of the given
// lifecycle mode: Persistent for PV-backed volumes, Ephemeral for CSI inline
// volumes in a pod spec.
func (p Policy) SupportsLifecycleMode(mode storagev1.VolumeLifecycleMode) bool {
	return slices.Contains(p.VolumeLifecycleModes, mode)
}

// Equal tells whether two policies configure the same behaviour. List order
// is significant for TokenRequests and VolumeLifecycleModes, as it is in the
// API object.
func (p Policy) Equal(o Policy) bool {
	return p.AttachRequired == o.AttachRequired &&
		p.PodInfoOnMount == o.PodInfoOnMount &&
		p.FSGroupPolicy == o.FSGroupPolicy &&
		p.RequiresRepublish == o.RequiresRepublish &&
		p.SELinuxMount == o.SELinuxMount &&
		p.ServiceAccountTokenInSecrets == o.ServiceAccountTokenInSecrets &&
		p.NodeAllocatableUpdatePeriod == o.NodeAllocatableUpdatePeriod &&
		slices.Equal(p.VolumeLifecycleModes, o.VolumeLifecycleModes) &&
		slices.EqualFunc(p.TokenRequests, o.TokenRequests, tokenRequestEqual)
}

func tokenRequestEqual(a, b storagev1.TokenRequest) bool {
	if a.Audience != b.Audience {
		return false
	}
	if a.ExpirationSeconds == nil || b.ExpirationSeconds == nil {
		return a.ExpirationSeconds == nil && b.ExpirationSeconds == nil
	}
	return *a.ExpirationSeconds == *b.ExpirationSeconds
}
