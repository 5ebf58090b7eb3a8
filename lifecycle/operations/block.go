package operations

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
)

// A published block volume is mapped in the kubelet's layout
// (pkg/volume/csi/csi_block.go, pkg/volume/util MapBlockVolume and
// volumepathhandler): the driver publishes the device at the target path;
// the global map path gets a bind mount of it per pod (MapFile), held open
// by a loop device so that the device cannot silently go away and come
// back as another one under the same name; and the pod's device
// (DeviceLink) is a symbolic link to the target, which a runtime hands to
// the containers. Unmapping goes in the kubelet's order (UnmapBlockVolume):
// the loop device, the pod's link, the global map's bind mount; then
// NodeUnpublishVolume. The volume is unstaged only once its global map
// holds no device (the kubelet's GetDeviceBindMountRefs check).

// mapBlock maps the device published at pub.Target. It is idempotent: what
// is in place already is kept.
func (o *Operations) mapBlock(pub paths.Publishing) error {
	device := pub.Target
	fi, err := os.Stat(device)
	if err != nil {
		return fmt.Errorf("the published device: %w", err)
	}
	if fi.Mode()&os.ModeDevice == 0 {
		return fmt.Errorf("the driver published %s, which is not a device", device)
	}
	err = o.tree.write(func() error {
		if err := os.MkdirAll(filepath.Dir(pub.MapFile), 0o750); err != nil {
			return err
		}
		return os.MkdirAll(filepath.Dir(pub.DeviceLink), 0o750)
	})
	if err != nil {
		return fmt.Errorf("creating the block map directories: %w", err)
	}
	if err := bindDevice(device, pub.MapFile); err != nil {
		return err
	}
	if err := linkDevice(device, pub.DeviceLink); err != nil {
		return err
	}
	if _, err := loopdev.Attach(pub.MapFile); err != nil {
		return fmt.Errorf("holding the device open with a loop device on %s: %w", pub.MapFile, err)
	}
	return nil
}

// bindDevice bind-mounts device at mapFile, unless a device is there
// already (the kubelet's mapBindMountDevice).
func bindDevice(device, mapFile string) error {
	fi, err := os.Lstat(mapFile)
	switch {
	case err == nil && fi.Mode()&os.ModeDevice != 0:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		f, err := os.OpenFile(mapFile, os.O_CREATE|os.O_RDWR, 0o750)
		if err != nil {
			return fmt.Errorf("creating %s: %w", mapFile, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("creating %s: %w", mapFile, err)
		}
	case err != nil:
		return fmt.Errorf("stat %s: %w", mapFile, err)
	}
	if err := unix.Mount(device, mapFile, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s at %s: %w", device, mapFile, err)
	}
	return nil
}

// linkDevice makes link a symbolic link to device (the kubelet's
// mapSymlinkDevice).
func linkDevice(device, link string) error {
	if to, err := os.Readlink(link); err == nil && to == device {
		return nil
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", link, err)
	}
	if err := os.Symlink(device, link); err != nil {
		return fmt.Errorf("linking the pod's device %s: %w", link, err)
	}
	return nil
}

// unmapBlock undoes mapBlock, in the kubelet's order: the loop device that
// holds the device open, the pod's link, the global map's bind mount. The
// directories that became empty go too. What is not there is fine.
func (o *Operations) unmapBlock(pub paths.Publishing) error {
	if err := loopdev.Detach(pub.MapFile); err != nil {
		return fmt.Errorf("releasing the loop device on %s: %w", pub.MapFile, err)
	}
	if fi, err := os.Lstat(pub.DeviceLink); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := os.Remove(pub.DeviceLink); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the pod's device %s: %w", pub.DeviceLink, err)
		}
	}
	if err := o.tree.prune(filepath.Dir(pub.DeviceLink), o.layout.PodsDir()); err != nil {
		return err
	}
	if err := o.cleanupMountPoint(pub.MapFile); err != nil {
		return err
	}
	return o.tree.prune(filepath.Dir(pub.MapFile), o.layout.PluginDir())
}

// mappedDevices lists the devices left in a block volume's global map
// (the kubelet's GetDeviceBindMountRefs): pods still mapped, which keep the
// volume from being unstaged.
func mappedDevices(mapDir string) ([]string, error) {
	entries, err := os.ReadDir(mapDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the global map %s: %w", mapDir, err)
	}
	var out []string
	for _, e := range entries {
		// Lstat, not the entry's type: readdir reports the file under the
		// bind mount, a regular file.
		p := filepath.Join(mapDir, e.Name())
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeDevice != 0 {
			out = append(out, p)
		}
	}
	return out, nil
}
