package app

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// ChangeOptions are the flags of what the agent does for volumes that change
// while in use.
type ChangeOptions struct {
	MountCheckPeriod  time.Duration
	MountCheckDrivers []string
	StatsPeriod       time.Duration
	StatsConcurrency  int
	RepublishPeriod   time.Duration
	ExpectedDrivers   []string
}

// addChangeFlags registers the flags of ChangeOptions.
func (o *ChangeOptions) addChangeFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.MountCheckPeriod, "mount-check-period", o.MountCheckPeriod, "How often the staged and published mounts of --mount-check-drivers are verified and broken ones set up again (e.g. for FUSE drivers); 0 verifies a driver's mounts only when it registers again.")
	fs.DurationVar(&o.StatsPeriod, "stats-period", time.Minute, "How often the usage and health of every published volume are collected from drivers with GET_VOLUME_STATS or GET_VOLUME_HEALTH (kubelet_volume_stats_* metrics, status API); negative disables it.")
	fs.IntVar(&o.StatsConcurrency, "stats-concurrency", 4, "How many volume stats calls may be in flight at once.")
	fs.DurationVar(&o.RepublishPeriod, "republish-period", time.Minute, "How often the volumes of drivers whose CSIDriver has requiresRepublish are published again (the kubelet does it at every pod sync, about a minute); a driver with tokenRequests is republished at least every tenth of its tokens' lifetime.")
	fs.StringSliceVar(&o.ExpectedDrivers, "expected-drivers", o.ExpectedDrivers, "With --register-node: CSI drivers the node needs; until all have registered the Node carries the NoSchedule taint csi-volmgr.io/drivers-not-ready.")
	fs.StringSliceVar(&o.MountCheckDrivers, "mount-check-drivers", o.MountCheckDrivers, "Drivers whose mounts --mount-check-period verifies; empty means all.")
}

// changes is the volume manager's ChangesConfig of the flags.
func (o *ChangeOptions) changes() volumemanager.ChangesConfig {
	return volumemanager.ChangesConfig{
		MountCheckPeriod:  o.MountCheckPeriod,
		MountCheckDrivers: o.MountCheckDrivers,
		StatsPeriod:       o.StatsPeriod,
		StatsConcurrency:  o.StatsConcurrency,
		RepublishPeriod:   o.RepublishPeriod,
	}
}
