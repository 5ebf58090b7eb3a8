package source

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// PVC returns a referenced PersistentVolumeClaim from the cache. Errors:
// ErrNotReferenced, ErrNotSynced (wait for OnPodChange), the API's
// NotFound when the claim does not exist, or, while it has never been
// read, the error its reads fail with once it counts as unreadable:
// Forbidden and the like at once, errors that may pass after
// unreadableAfter (OnPodChange tells then, and when a read succeeds). In
// GET-only mode Forbidden is one that may pass: the Node authorizer's
// graph may not relate a just-bound claim or volume to the node yet.
// Never modify the result.
func (s *Source) PVC(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	return get[*corev1.PersistentVolumeClaim](s.caches[KindPersistentVolumeClaim],
		cache.ObjectName{Namespace: namespace, Name: name})
}

// ReadPVC reads a referenced claim from the API server now, for a caller
// about to act on a change of the claim's volume: a settled claim is cached
// as last read, up to a period ago, while its volume may have been read
// since (an expansion changes the volume, then the claim). The cache takes
// what was read, as the claim's periodic re-read would: a claim that is no
// longer settled is watched (in GET-only mode polled) again. With a watch-all or cluster-wide cache
// it still reads from the API server, which is ahead of any watch. Errors:
// ErrNotReferenced and the API's. Never modify the result.
func (s *Source) ReadPVC(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	key := cache.ObjectName{Namespace: namespace, Name: name}
	c, ok := s.caches[KindPersistentVolumeClaim].(*byNameCache)
	if !ok {
		if _, err := s.caches[KindPersistentVolumeClaim].get(key); errors.Is(err, ErrNotReferenced) {
			return nil, err
		}
		return s.cfg.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	obj, err := c.read(ctx, key)
	if err != nil {
		return nil, err
	}
	pvc, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return nil, fmt.Errorf("unexpected %T read for claim %s", obj, key)
	}
	return pvc, nil
}

// PV returns a referenced PersistentVolume from the cache; errors as PVC.
// Never modify the result.
func (s *Source) PV(name string) (*corev1.PersistentVolume, error) {
	return get[*corev1.PersistentVolume](s.caches[KindPersistentVolume], cache.ObjectName{Name: name})
}

// VolumeAttachment returns a referenced VolumeAttachment (by its name,
// volume.AttachmentName(handle, driver, node)) from the cache; errors as
// PVC. ErrNotSynced and NotFound both mean "not attached yet": the volumes
// waiting for it are reported to OnAttachmentChange when it changes. In
// GET-only mode a VolumeAttachment whose GET is Forbidden reads as
// NotFound: the Node authorizer forbids one it has not related to the node,
// which includes one not created yet. Never modify the result.
func (s *Source) VolumeAttachment(name string) (*storagev1.VolumeAttachment, error) {
	return get[*storagev1.VolumeAttachment](s.caches[KindVolumeAttachment], cache.ObjectName{Name: name})
}

// Attachments returns a by-name VolumeAttachment getter over the Source's
// caches, shaped like client-go's lister (lifecycle/operations'
// Attachments interface).
func (s *Source) Attachments() AttachmentGetter { return AttachmentGetter{s: s} }

// AttachmentGetter reads referenced VolumeAttachments from the Source's
// caches; see Source.Attachments.
type AttachmentGetter struct{ s *Source }

// Get returns the VolumeAttachment name. It fails with the API's NotFound
// when the VolumeAttachment does not exist, and with an error wrapping
// both volume.ErrNotAttached and ErrNotSynced (or ErrNotReferenced) while
// its watch has not listed it yet: not attached as far as anyone can tell,
// and OnAttachmentChange reports the volume when that changes.
func (g AttachmentGetter) Get(name string) (*storagev1.VolumeAttachment, error) {
	va, err := g.s.VolumeAttachment(name)
	if errors.Is(err, ErrNotSynced) || errors.Is(err, ErrNotReferenced) {
		return nil, fmt.Errorf("%w: %w", volume.ErrNotAttached, err)
	}
	return va, err
}

func get[T runtime.Object](c objectCache, key cache.ObjectName) (T, error) {
	var zero T
	obj, err := c.get(key)
	if err != nil {
		return zero, err
	}
	typed, ok := obj.(T)
	if !ok {
		return zero, fmt.Errorf("unexpected %T in the cache of %s", obj, key)
	}
	return typed, nil
}
