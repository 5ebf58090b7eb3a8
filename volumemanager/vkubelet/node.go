package vkubelet

import (
	"context"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// ControllerManagedAttachAnnotation makes the attach/detach controller
// attach and detach the node's volumes (the kubelet sets it when it
// registers).
const ControllerManagedAttachAnnotation = volumemanager.ControllerManagedAttachAnnotation

// OwnerLabel and OwnerLabelValue mark the Node as one whose volume manager
// is csi-volmgr; the volume manager acts on no Node without them.
const (
	OwnerLabel      = volumemanager.OwnerLabel
	OwnerLabelValue = volumemanager.OwnerLabelValue
)

// PrepareNode readies the Node a provider gives NewNodeController: the
// label OwnerLabel=OwnerLabelValue set (without it the volume manager does
// nothing for the Node), the attach/detach annotation set,
// status.volumesInUse left to the volume manager.
func PrepareNode(n *corev1.Node) {
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[OwnerLabel] = OwnerLabelValue
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[ControllerManagedAttachAnnotation] = "true"
	n.Status.VolumesInUse = nil
}

// NewNodeProvider wraps the provider's node.NodeProvider: every Node it
// reports goes through PrepareNode (on a copy) before the node controller
// patches it.
func NewNodeProvider(p node.NodeProvider) node.NodeProvider { return nodeProvider{p} }

type nodeProvider struct{ node.NodeProvider }

// NotifyNodeStatus prepares every Node the provider reports.
func (p nodeProvider) NotifyNodeStatus(ctx context.Context, cb func(*corev1.Node)) {
	p.NodeProvider.NotifyNodeStatus(ctx, func(n *corev1.Node) {
		n = n.DeepCopy()
		PrepareNode(n)
		cb(n)
	})
}
