package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// blockDeviceFile is the file inside a block volume's staging directory onto which the loop device is bind-mounted.
const blockDeviceFile = "device"

// errForeignMount means a path is already a mount point, of something other than the volume.
var errForeignMount = errors.New("path is a mount point of something else")

// isMountOf reports whether path is a mount point that shows source: a bind mount's root is the
// source's inode, so stat(path) and stat(source) return the same file exactly when path is a
// (possibly indirect) bind mount of source. A missing path is not an error.
func isMountOf(m mount.Interface, path, source string) (bool, error) {
	mounted, err := m.IsMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check mount point %s: %w", path, err)
	}
	if !mounted || source == "" {
		return false, nil
	}
	pi, err := os.Stat(path)
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	si, err := os.Stat(source)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", source, err)
	}
	return os.SameFile(pi, si), nil
}

// bindOptions are the mount options for a bind mount, read-only if asked, plus the capability's mount flags.
func bindOptions(readOnly bool, flags []string) []string {
	opts := []string{"bind"}
	if readOnly {
		opts = append(opts, "ro")
	}
	return append(opts, flags...)
}

// ensureBindMount bind-mounts from onto target unless target already shows volumeSource. A broken
// mount at target (ENOTCONN, EIO, ...: its FUSE server died) is unmounted first. target is created as a directory, or as a file when asFile is set (for block devices).
// It fails with errForeignMount when target is a mount point of something else.
func ensureBindMount(logger klog.Logger, m mount.Interface, from, target, volumeSource string, asFile bool, opts []string) error {
	if err := replaceBrokenMount(logger, target); err != nil {
		return err
	}
	ours, err := isMountOf(m, target, volumeSource)
	if err != nil {
		return err
	}
	if ours {
		logger.V(4).Info("Already mounted", "targetPath", target)
		return nil
	}
	if err := makeMountPoint(target, asFile); err != nil {
		return err
	}
	if mounted, err := m.IsMountPoint(target); err != nil {
		return fmt.Errorf("check mount point %s: %w", target, err)
	} else if mounted {
		return fmt.Errorf("%s: %w", target, errForeignMount)
	}
	if err := bindMount(m, from, target, opts); err != nil {
		return fmt.Errorf("bind-mount %s at %s: %w", from, target, err)
	}
	logger.V(4).Info("Bind-mounted", "source", from, "targetPath", target, "options", opts)
	return nil
}

// bindMount bind-mounts from at target with opts (bindOptions). A plain or read-only bind mount
// is made with mount(2) itself; other options go through mount(8), which knows their names. The
// mount(8) binary costs a fork, an exec and, through libmount, a parse of the whole mount table
// on every call: with a thousand volumes mounted, most of the plugin's CPU time.
func bindMount(m mount.Interface, from, target string, opts []string) error {
	switch {
	case slices.Equal(opts, []string{"bind"}):
		return unix.Mount(from, target, "", unix.MS_BIND, "")
	case slices.Equal(opts, []string{"bind", "ro"}):
		if err := unix.Mount(from, target, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		// A bind mount takes MS_RDONLY only on a remount.
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(target, 0)
			return fmt.Errorf("making it read-only: %w", err)
		}
		return nil
	}
	return m.Mount(from, target, "", opts)
}

func makeMountPoint(path string, asFile bool) error {
	if !asFile {
		if err := os.MkdirAll(path, 0o750); err != nil {
			return fmt.Errorf("create directory %s: %w", path, err)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("create directory %s: %w", filepath.Dir(path), err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return fmt.Errorf("create file %s: %w", path, err)
	}
	return f.Close()
}

// unmountAll unmounts path as long as it is a mount point showing volumeSource,
// so that mounts stacked by earlier retries go too.
func unmountAll(logger klog.Logger, m mount.Interface, path, volumeSource string) error {
	for {
		ours, err := isMountOf(m, path, volumeSource)
		if err != nil {
			return err
		}
		if !ours {
			return nil
		}
		if err := unix.Unmount(path, 0); err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
		logger.V(4).Info("Unmounted", "targetPath", path)
	}
}

// removeMountPoint removes a directory or file the plugin created for a mount,
// unless it is still a mount point or a non-empty directory.
func removeMountPoint(m mount.Interface, path string) error {
	mounted, err := m.IsMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check mount point %s: %w", path, err)
	}
	if mounted {
		return fmt.Errorf("%s: %w", path, errForeignMount)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}
