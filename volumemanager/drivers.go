package volumemanager

import (
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
)

// lifecycleDrivers adapts the driver registry to the lifecycle's view of
// the registered drivers.
type lifecycleDrivers struct{ *registry.Registry }

var _ lifecycle.Drivers = lifecycleDrivers{}

// NodeID returns the node ID a registered driver reported.
func (d lifecycleDrivers) NodeID(name string) (string, bool) {
	drv, ok := d.Driver(name)
	return drv.NodeID, ok
}

// OnRegistered subscribes fn to registrations and re-registrations.
func (d lifecycleDrivers) OnRegistered(fn func(driver string)) {
	d.Subscribe(func(ev registry.Event) {
		if ev.Type == registry.Registered {
			fn(ev.Driver)
		}
	})
}

// OnReconnected subscribes fn to the recoveries of registered drivers'
// lost connections.
func (d lifecycleDrivers) OnReconnected(fn func(driver string)) {
	d.Subscribe(func(ev registry.Event) {
		if ev.Type == registry.Reconnected {
			fn(ev.Driver)
		}
	})
}

// reportRejections has every rejected driver registration recorded as a
// Warning Event on the Node (lifecycle.Manager.DriverRegistrationFailed).
func reportRejections(reg *registry.Registry, m *lifecycle.Manager) {
	reg.Subscribe(func(ev registry.Event) {
		if ev.Type == registry.Rejected {
			m.DriverRegistrationFailed(ev.Driver, ev.Socket, ev.Err)
		}
	})
}
