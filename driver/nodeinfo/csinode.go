package nodeinfo

import (
	"context"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

var nodeKind = corev1.SchemeGroupVersion.WithKind("Node")

// isRetriable tells whether a CSINode write lost a race: a conflicting
// update, or a create after someone else created the object.
func isRetriable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
}

// updateCSINode reads the CSINode, applies edit to a copy of its driver list
// and, if that changed the list, writes it back as a strategic merge patch
// guarded by the resourceVersion it read; races are retried with m.backoff
// from a fresh read.
//
// With node != nil (Install, EnsureCSINode) a missing CSINode is created with
// an ownerReference to node, and a CSINode that node does not own (it was
// left behind by an earlier Node object of the same name) is deleted and
// created afresh, as the kubelet does. With node == nil (Uninstall) a missing
// CSINode is left missing and ownership is not checked.
func (m *Manager) updateCSINode(ctx context.Context, node *corev1.Node,
	edit func([]storagev1.CSINodeDriver) []storagev1.CSINodeDriver) error {
	logger := klog.FromContext(ctx)
	csiNodes := m.client.StorageV1().CSINodes()
	return retry.OnError(m.backoff, isRetriable, func() error {
		current, err := csiNodes.Get(ctx, m.nodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if node == nil {
				return nil
			}
			return m.createCSINode(ctx, node, edit(nil))
		case err != nil:
			return fmt.Errorf("getting CSINode: %w", err)
		}

		if node != nil && !ownedBy(current, node) {
			logger.Info("Replacing CSINode that is not owned by the current Node object",
				"ownerReferences", current.OwnerReferences, "nodeUID", node.UID)
			err := csiNodes.Delete(ctx, current.Name, metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &current.UID, ResourceVersion: &current.ResourceVersion},
			})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting stale CSINode: %w", err)
			}
			return m.createCSINode(ctx, node, edit(nil))
		}

		modified := current.DeepCopy()
		modified.Spec.Drivers = edit(modified.Spec.Drivers)
		annotated := setMigratedPlugins(modified)
		if !annotated && equality.Semantic.DeepEqual(current.Spec, modified.Spec) {
			return nil
		}
		patch, err := preconditionedPatch(current, modified, storagev1.CSINode{}, current.ResourceVersion)
		if err != nil {
			return fmt.Errorf("computing CSINode patch: %w", err)
		}
		logger.V(4).Info("Patching CSINode", "patch", string(patch))
		if _, err := csiNodes.Patch(ctx, m.nodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("patching CSINode: %w", err)
		}
		return nil
	})
}

func (m *Manager) createCSINode(ctx context.Context, node *corev1.Node, drivers []storagev1.CSINodeDriver) error {
	if drivers == nil {
		drivers = []storagev1.CSINodeDriver{}
	}
	csiNode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name: m.nodeName,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: nodeKind.GroupVersion().String(),
				Kind:       nodeKind.Kind,
				Name:       node.Name,
				UID:        node.UID,
			}},
		},
		Spec: storagev1.CSINodeSpec{Drivers: drivers},
	}
	setMigratedPlugins(csiNode)
	if _, err := m.client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating CSINode: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Created CSINode", "nodeUID", node.UID)
	return nil
}

// ownedBy tells whether csiNode has an ownerReference to node (same name and
// UID), which is how the kubelet recognizes its own CSINode.
func ownedBy(csiNode *storagev1.CSINode, node *corev1.Node) bool {
	for _, ref := range csiNode.OwnerReferences {
		if ref.Kind == nodeKind.Kind && ref.Name == node.Name && ref.UID == node.UID {
			return true
		}
	}
	return false
}

// csiNodeEntry is the CSINode driver entry for info.
func csiNodeEntry(ctx context.Context, info DriverInfo) storagev1.CSINodeDriver {
	entry := storagev1.CSINodeDriver{Name: info.Name, NodeID: info.NodeID}
	if len(info.Topology) > 0 {
		entry.TopologyKeys = slices.Sorted(maps.Keys(info.Topology))
	}
	if count := allocatableCount(ctx, info.MaxVolumes); count != nil {
		entry.Allocatable = &storagev1.VolumeNodeResources{Count: count}
	}
	return entry
}

// setDriver replaces the entry with entry's name in place, or appends entry.
func setDriver(drivers []storagev1.CSINodeDriver, entry storagev1.CSINodeDriver) []storagev1.CSINodeDriver {
	i := slices.IndexFunc(drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == entry.Name })
	if i < 0 {
		return append(drivers, entry)
	}
	drivers[i] = entry
	return drivers
}

// removeDriver removes the entry named name.
func removeDriver(drivers []storagev1.CSINodeDriver, name string) []storagev1.CSINodeDriver {
	return slices.DeleteFunc(drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == name })
}
