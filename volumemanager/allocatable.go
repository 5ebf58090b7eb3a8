package volumemanager

import (
	"context"
	"time"

	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
)

// newAllocatable builds, in cluster mode, the refresher of the drivers'
// allocatable counts in the CSINode (KEP-4876): periodic for drivers whose
// CSIDriver sets nodeAllocatableUpdatePeriodSeconds, and at once after an
// attach failed for the limit (the lifecycle's AttachLimits).
func (vm *VolumeManager) newAllocatable() error {
	if vm.nodeInfo == nil {
		return nil
	}
	r, err := nodeinfo.NewAllocatableRefresher(nodeinfo.AllocatableConfig{
		NodeInfo: ownedNodeInfo{vm: vm, inner: vm.nodeInfo},
		Client: func(driver string) (nodeinfo.InfoClient, bool) {
			c, ok := vm.registry.Client(driver)
			if !ok || c == nil {
				return nil, false
			}
			return c, true
		},
		Period:  func(driver string) time.Duration { return vm.policies.Get(driver).NodeAllocatableUpdatePeriod },
		Updated: vm.registry.SetMaxVolumes,
	})
	if err != nil {
		return err
	}
	vm.allocatable = r
	vm.registry.Subscribe(func(ev registry.Event) {
		if ev.Type != registry.Registered {
			return
		}
		if d, ok := vm.registry.Driver(ev.Driver); ok {
			r.Registered(d.Name, d.MaxVolumes)
		}
	})
	vm.policies.OnChange(r.PeriodChanged)
	return nil
}

// runAllocatable runs the refresher, if any, until ctx ends: once the API
// server's version is known, and only if it lets a CSINode's allocatable
// count change (kubeversion.Features.MutableCSINodeAllocatableCount, from
// 1.35). Before, the count written at registration stays, as with the
// kubelet of 1.34, and nothing writes what the API server would refuse
// (detectServer has logged that once).
func (vm *VolumeManager) runAllocatable(ctx context.Context) {
	if vm.allocatable == nil {
		return
	}
	if f, ok := vm.serverFeatures(ctx); !ok || !f.MutableCSINodeAllocatableCount {
		return
	}
	vm.allocatable.Run(ctx)
}

// attachLimits adapts the refresher to the lifecycle's AttachLimits.
type attachLimits struct {
	r *nodeinfo.AllocatableRefresher
}

// ResourceExhausted refreshes the driver's count now.
func (a attachLimits) ResourceExhausted(driver string) { a.r.Refresh(driver) }

// driversSynced tells whether the driver registry has handled every
// socket found at start.
func (vm *VolumeManager) driversSynced() bool { return vm.registry != nil && vm.registry.HasSynced() }

// driverRegistered says whether a driver is registered now (the registry
// is made after the Node keeper that asks).
func (vm *VolumeManager) driverRegistered(name string) bool {
	if vm.registry == nil {
		return false
	}
	_, ok := vm.registry.Client(name)
	return ok
}
