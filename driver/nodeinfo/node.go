package nodeinfo

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// nodeMeta is the part of the Node that this package changes: private copies
// of its labels and annotations, edited by the set/remove methods.
type nodeMeta struct {
	labels      map[string]string
	annotations map[string]string
}

// getNode reads the Node; a missing Node is reported as ErrNodeNotFound.
func (m *Manager) getNode(ctx context.Context) (*corev1.Node, error) {
	node, err := m.client.CoreV1().Nodes().Get(ctx, m.nodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %w", ErrNodeNotFound, err)
	}
	if err != nil {
		return nil, fmt.Errorf("getting Node: %w", err)
	}
	return node, nil
}

// updateNode reads the Node, applies edit to a copy of its labels and
// annotations and, if anything changed, writes the difference back as a
// strategic merge patch that carries the resourceVersion it read, so that a
// concurrent change of the Node makes the patch fail with Conflict instead of
// overwriting it; conflicts are retried with m.backoff from a fresh read.
// An edit error aborts without a write. It returns the Node as last read or
// written.
func (m *Manager) updateNode(ctx context.Context, edit func(*nodeMeta) error) (*corev1.Node, error) {
	logger := klog.FromContext(ctx)
	var latest *corev1.Node
	err := retry.RetryOnConflict(m.backoff, func() error {
		node, err := m.getNode(ctx)
		if err != nil {
			return err
		}
		meta := nodeMeta{labels: maps.Clone(node.Labels), annotations: maps.Clone(node.Annotations)}
		if err := edit(&meta); err != nil {
			return err
		}
		if maps.Equal(meta.labels, node.Labels) && maps.Equal(meta.annotations, node.Annotations) {
			latest = node
			return nil
		}
		modified := node.DeepCopy()
		modified.Labels = meta.labels
		modified.Annotations = meta.annotations
		patch, err := preconditionedPatch(node, modified, corev1.Node{}, node.ResourceVersion)
		if err != nil {
			return fmt.Errorf("computing Node patch: %w", err)
		}
		logger.V(4).Info("Patching Node", "patch", string(patch))
		patched, err := m.client.CoreV1().Nodes().Patch(ctx, m.nodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("patching Node: %w", err)
		}
		latest = patched
		return nil
	})
	return latest, err
}

// nodeIDs parses the node ID annotation. A missing annotation is an empty map.
func (n *nodeMeta) nodeIDs() (map[string]string, error) {
	ids := map[string]string{}
	value := n.annotations[AnnotationNodeID]
	if value == "" {
		return ids, nil
	}
	if err := json.Unmarshal([]byte(value), &ids); err != nil {
		return nil, fmt.Errorf("parsing Node annotation %s=%q: %w", AnnotationNodeID, value, err)
	}
	if ids == nil { // the annotation was the JSON literal null
		ids = map[string]string{}
	}
	return ids, nil
}

func (n *nodeMeta) storeNodeIDs(ids map[string]string) error {
	if len(ids) == 0 {
		delete(n.annotations, AnnotationNodeID)
		return nil
	}
	value, err := json.Marshal(ids) // keys are sorted, so equal maps give equal values
	if err != nil {
		return fmt.Errorf("encoding Node annotation %s: %w", AnnotationNodeID, err)
	}
	if n.annotations == nil {
		n.annotations = map[string]string{}
	}
	n.annotations[AnnotationNodeID] = string(value)
	return nil
}

// setNodeID records driver → nodeID in the annotation, keeping the entries
// of other drivers.
func (n *nodeMeta) setNodeID(driver, nodeID string) error {
	ids, err := n.nodeIDs()
	if err != nil {
		return err
	}
	if current, ok := ids[driver]; ok && current == nodeID {
		return nil
	}
	ids[driver] = nodeID
	return n.storeNodeIDs(ids)
}

// removeNodeID removes driver from the annotation, and the annotation when
// no driver is left.
func (n *nodeMeta) removeNodeID(driver string) error {
	if _, ok := n.annotations[AnnotationNodeID]; !ok {
		return nil
	}
	ids, err := n.nodeIDs()
	if err != nil {
		return err
	}
	if _, ok := ids[driver]; !ok {
		return nil
	}
	delete(ids, driver)
	return n.storeNodeIDs(ids)
}

// setTopologyLabels adds the driver's topology segments as labels. If any
// segment's key is already a label with a different value, it changes
// nothing and returns a *TopologyConflictError listing every collision.
//
// Unlike the kubelet, it records in AnnotationTopologyLabels which label keys
// the driver owns, so that removeTopologyLabels can take them away again: a
// key the driver added, or one that another driver added with the same
// value (shared ownership). A label that existed before any driver set it is
// never owned and never removed. Keys the driver owned but no longer reports
// are removed unless another driver owns them.
func (n *nodeMeta) setTopologyLabels(driver, nodeName string, topology map[string]string) error {
	var conflicts []LabelConflict
	for _, key := range slices.Sorted(maps.Keys(topology)) {
		if current, ok := n.labels[key]; ok && current != topology[key] {
			conflicts = append(conflicts, LabelConflict{Key: key, DriverValue: topology[key], NodeValue: current})
		}
	}
	if len(conflicts) > 0 {
		return &TopologyConflictError{Driver: driver, Node: nodeName, Conflicts: conflicts}
	}
	owners, err := n.topologyOwners()
	if err != nil {
		return err
	}
	if len(topology) > 0 && n.labels == nil {
		n.labels = map[string]string{}
	}
	var owned []string
	for _, key := range slices.Sorted(maps.Keys(topology)) {
		_, present := n.labels[key]
		if !present || slices.Contains(owners[driver], key) || ownedByOther(owners, driver, key) {
			owned = append(owned, key)
		}
		n.labels[key] = topology[key]
	}
	for _, key := range owners[driver] {
		if _, still := topology[key]; !still && !ownedByOther(owners, driver, key) {
			delete(n.labels, key)
		}
	}
	if len(owned) == 0 {
		delete(owners, driver)
	} else {
		owners[driver] = owned
	}
	return n.storeTopologyOwners(owners)
}

// removeTopologyLabels removes the labels the driver owns that no other
// driver owns, and the driver's ownership record.
func (n *nodeMeta) removeTopologyLabels(driver string) error {
	owners, err := n.topologyOwners()
	if err != nil {
		return err
	}
	keys, ok := owners[driver]
	if !ok {
		return nil
	}
	for _, key := range keys {
		if !ownedByOther(owners, driver, key) {
			delete(n.labels, key)
		}
	}
	delete(owners, driver)
	return n.storeTopologyOwners(owners)
}

func ownedByOther(owners map[string][]string, driver, key string) bool {
	for d, keys := range owners {
		if d != driver && slices.Contains(keys, key) {
			return true
		}
	}
	return false
}

// topologyOwners parses AnnotationTopologyLabels: driver → label keys it owns.
func (n *nodeMeta) topologyOwners() (map[string][]string, error) {
	owners := map[string][]string{}
	value := n.annotations[AnnotationTopologyLabels]
	if value == "" {
		return owners, nil
	}
	if err := json.Unmarshal([]byte(value), &owners); err != nil {
		return nil, fmt.Errorf("parsing Node annotation %s=%q: %w", AnnotationTopologyLabels, value, err)
	}
	if owners == nil {
		owners = map[string][]string{}
	}
	return owners, nil
}

func (n *nodeMeta) storeTopologyOwners(owners map[string][]string) error {
	if len(owners) == 0 {
		delete(n.annotations, AnnotationTopologyLabels)
		return nil
	}
	value, err := json.Marshal(owners)
	if err != nil {
		return fmt.Errorf("encoding Node annotation %s: %w", AnnotationTopologyLabels, err)
	}
	if n.annotations == nil {
		n.annotations = map[string]string{}
	}
	n.annotations[AnnotationTopologyLabels] = string(value)
	return nil
}
