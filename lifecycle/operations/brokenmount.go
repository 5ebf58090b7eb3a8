package operations

import (
	"os"

	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
)

// makeMountDir creates a directory the driver mounts at. A directory that
// is a broken mount (ENOTCONN, EIO, ...: a FUSE driver's mount whose server
// died) exists, though MkdirAll cannot tell: it is left for the driver,
// whose repeated NodeStageVolume replaces the broken mount.
func makeMountDir(path string) error {
	err := os.MkdirAll(path, checkpoint.DirMode)
	if err == nil {
		return nil
	}
	if _, statErr := os.Stat(path); mount.IsCorruptedMnt(statErr) {
		return nil
	}
	return err
}
