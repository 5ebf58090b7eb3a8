package operations

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// The agent mounts little itself (the drivers do), but it removes subPath
// mounts before an unpublish and makes the block layout's device bind
// mounts. It does so with mount(2) and umount(2): its image has no mount
// binaries, which k8s.io/mount-utils' Mounter would run.

// maxStacked bounds the unmounts of one path: mounts stacked on it by
// retries, never an endless loop on a path that stays mounted.
const maxStacked = 16

// unmount unmounts path while it is a mount point. A missing path is fine.
func (o *Operations) unmount(path string) error {
	for range maxStacked {
		mounted, err := o.mounts.IsMountPoint(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("checking whether %s is a mount point: %w", path, err)
		case !mounted:
			return nil
		}
		if err := unix.Unmount(path, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
	}
	return fmt.Errorf("%s is %w after %d unmounts", path, ErrStillMounted, maxStacked)
}

// cleanupMountPoint unmounts path and removes it (a file, or a directory
// that is empty once unmounted). A missing path is fine.
func (o *Operations) cleanupMountPoint(path string) error {
	if err := o.unmount(path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}
