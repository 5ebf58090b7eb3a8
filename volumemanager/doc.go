// Package volumemanager is csi-volmgr's volume manager as one value a
// runtime embeds, shaped like the kubelet's volumemanager.VolumeManager:
// New builds it from a Config, Run runs it until its context ends, Ready
// tells when it may be relied on, and Handler serves its metrics, health
// and JSON status API.
//
// It is the only place where the two wings of the agent meet: the driver
// layer (driver/registry finds CSI drivers through plugin-registration
// sockets, driver/policy caches CSIDriver objects, driver/nodeinfo writes
// CSINode) and the volume lifecycle (lifecycle/...), which sees drivers
// only through the small views it declares (lifecycle.Drivers,
// lifecycle.Policies). The front endpoint (front/) is started here too.
// The csi-volmgr command (cmd/csi-volmgr) only turns flags into a Config.
package volumemanager
