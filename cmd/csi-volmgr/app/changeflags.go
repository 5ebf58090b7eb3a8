package app

import (
	"github.com/spf13/pflag"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// addChangeFlags registers the flags of what the agent does for volumes
// that change while in use.
func (o *RunOptions) addChangeFlags(fs *pflag.FlagSet) {
	c := o.CSIVolmgrConfiguration
	fs.DurationVar(&c.MountCheckPeriod.Duration, "mount-check-period", c.MountCheckPeriod.Duration, "How often the staged and published mounts of --mount-check-drivers are verified and broken ones set up again (e.g. for FUSE drivers); 0 verifies a driver's mounts only when it registers again.")
	fs.DurationVar(&c.StatsPeriod.Duration, "stats-period", c.StatsPeriod.Duration, "How often the usage and health of every published volume are collected from drivers with GET_VOLUME_STATS or GET_VOLUME_HEALTH (kubelet_volume_stats_* metrics, status API); negative disables it.")
	fs.IntVar(&c.StatsConcurrency, "stats-concurrency", c.StatsConcurrency, "How many volume stats calls may be in flight at once.")
	fs.DurationVar(&c.RepublishPeriod.Duration, "republish-period", c.RepublishPeriod.Duration, "How often the volumes of drivers whose CSIDriver has requiresRepublish are published again (the kubelet does it at every pod sync, about a minute); a driver with tokenRequests is republished at least every tenth of its tokens' lifetime.")
	fs.StringSliceVar(&c.ExpectedDrivers, "expected-drivers", c.ExpectedDrivers, "With --register-node: CSI drivers the node needs; while one has not registered, no new pod is scheduled to the Node. Without --node-identity the Node carries the NoSchedule taint csi-volmgr.io/drivers-not-ready. With --node-identity (NodeRestriction forbids a node to change its own taints) the agent posts the Ready condition False, reason CSIVolmgrDriversNotRegistered, naming the missing drivers, as a kubelet whose network plugin is not ready: the node lifecycle controller then taints the Node node.kubernetes.io/not-ready NoSchedule and NoExecute, so pods that do not tolerate not-ready are evicted after their tolerationSeconds (300 by default; DaemonSet pods tolerate it).")
	fs.StringSliceVar(&c.MountCheckDrivers, "mount-check-drivers", c.MountCheckDrivers, "Drivers whose mounts --mount-check-period verifies; empty means all.")
}

// changes is the volume manager's ChangesConfig of the flags.
func (o *RunOptions) changes() volumemanager.ChangesConfig {
	return volumemanager.ChangesConfig{
		MountCheckPeriod:  o.MountCheckPeriod.Duration,
		MountCheckDrivers: o.MountCheckDrivers,
		StatsPeriod:       o.StatsPeriod.Duration,
		StatsConcurrency:  o.StatsConcurrency,
		RepublishPeriod:   o.RepublishPeriod.Duration,
	}
}
