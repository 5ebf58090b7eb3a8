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
}

// addChangeFlags registers the flags of ChangeOptions.
func (o *ChangeOptions) addChangeFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.MountCheckPeriod, "mount-check-period", o.MountCheckPeriod, "How often the staged and published mounts of --mount-check-drivers are verified and broken ones set up again (e.g. for FUSE drivers); 0 verifies a driver's mounts only when it registers again.")
	fs.StringSliceVar(&o.MountCheckDrivers, "mount-check-drivers", o.MountCheckDrivers, "Drivers whose mounts --mount-check-period verifies; empty means all.")
}

// changes is the volume manager's ChangesConfig of the flags.
func (o *ChangeOptions) changes() volumemanager.ChangesConfig {
	return volumemanager.ChangesConfig{
		MountCheckPeriod:  o.MountCheckPeriod,
		MountCheckDrivers: o.MountCheckDrivers,
	}
}
