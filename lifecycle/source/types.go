package source

import (
	"errors"

	"k8s.io/client-go/tools/cache"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Errors of the cached reads. NotFound is reported as the API's NotFound
// error (apierrors.IsNotFound).
var (
	// ErrNotSynced means the object's cache has not received its first list
	// yet, typically because the reference was just added. Not a failure:
	// the pods referencing the object are notified (OnPodChange) and its
	// attachment subscribers (OnAttachmentChange) as soon as it syncs.
	ErrNotSynced = errors.New("cache not synced yet")
	// ErrNotReferenced means no pod references the object, so it is not
	// watched (by-name mode only). Declare the reference first.
	ErrNotReferenced = errors.New("object is not referenced by any pod, so it is not watched")
)

// Kind names the kinds of objects the Source caches.
type Kind string

// The kinds a Source caches.
const (
	KindPod                   Kind = "Pod"
	KindPersistentVolumeClaim Kind = "PersistentVolumeClaim"
	KindPersistentVolume      Kind = "PersistentVolume"
	KindVolumeAttachment      Kind = "VolumeAttachment"
)

// References are the objects one pod's volumes need. The populator declares
// them (AddReferences, SetReferences); the Source watches each referenced
// object while at least one pod references it and tells the referencing
// pods when it changes.
type References struct {
	// PVCs are the claims the pod's volumes use, by namespace and name.
	PVCs []cache.ObjectName
	// PVs are the PersistentVolumes those claims are bound to.
	PVs []string
	// Attachments are the VolumeAttachments the pod's volumes wait for.
	Attachments []Attachment
}

// Attachment is a VolumeAttachment some volume waits for.
type Attachment struct {
	// Name is the VolumeAttachment's name: volume.AttachmentName(handle,
	// driver, node).
	Name string
	// Volume is the volume that waits for it, reported by
	// OnAttachmentChange.
	Volume volume.Name
}

// Stats tell how much the Source watches and caches.
type Stats struct {
	// Watches counts the open watches per kind: one per referenced object in
	// by-name mode that is not settled, none in GET-only mode, one per
	// informer otherwise (pods always use one).
	Watches map[Kind]int
	// Objects counts the cached objects per kind.
	Objects map[Kind]int
}

// TotalWatches is the number of open watches of all kinds.
func (s Stats) TotalWatches() int { return sum(s.Watches) }

// TotalObjects is the number of cached objects of all kinds.
func (s Stats) TotalObjects() int { return sum(s.Objects) }

func sum(m map[Kind]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
