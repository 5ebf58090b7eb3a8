package volumemanager

import (
	"context"
	"fmt"

	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
)

// OwnerLabel and OwnerLabelValue mark a Node whose volume manager is
// csi-volmgr. In cluster mode the agent acts on its Node — mounts,
// unmounts, writes the Node, its status, its CSINode and its pods' status —
// only while the Node carries OwnerLabel=OwnerLabelValue: the node keeper
// (RegisterNode) sets it on the Node it creates, vkubelet.PrepareNode on a
// runtime's Node, and a runtime beside the agent sets it itself. A Node
// without it is another volume manager's (a kubelet's): the agent does
// nothing there and reports not ready.
const (
	OwnerLabel      = nodeowner.Label
	OwnerLabelValue = nodeowner.Value
)

// NodeOwned tells whether the agent owns its Node (always in standalone
// mode) and, when it does not, why.
func (vm *VolumeManager) NodeOwned() (bool, string) { return vm.manager.NodeOwner().Owned() }

// ownedNodeInfo is the node info publisher of the registry and of the
// allocatable refresher, behind the owner Gate: nothing is written to the
// Node or its CSINode while the agent does not own the Node. Install waits
// for the Gate within its context (the registration's handshake timeout)
// and fails with the reason after it, so that the registration is retried
// with backoff.
type ownedNodeInfo struct {
	vm    *VolumeManager
	inner *nodeinfo.Manager
}

func (o ownedNodeInfo) Install(ctx context.Context, info nodeinfo.DriverInfo) error {
	gate := o.vm.manager.NodeOwner()
	if gate.Wait(ctx) != nil {
		return fmt.Errorf("not publishing driver %s into the Node: %w", info.Name, gate.Err())
	}
	return o.inner.Install(ctx, info)
}

func (o ownedNodeInfo) Uninstall(ctx context.Context, driverName string) error {
	if err := o.vm.manager.NodeOwner().Err(); err != nil {
		return fmt.Errorf("not removing driver %s from the Node: %w", driverName, err)
	}
	return o.inner.Uninstall(ctx, driverName)
}

func (o ownedNodeInfo) UpdateAllocatable(ctx context.Context, driverName string, maxVolumes int64) error {
	if err := o.vm.manager.NodeOwner().Err(); err != nil {
		return fmt.Errorf("not updating driver %s's allocatable count: %w", driverName, err)
	}
	return o.inner.UpdateAllocatable(ctx, driverName, maxVolumes)
}
