package operations

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// cleanSubPaths unmounts and removes every subPath bind mount a container
// runtime made of a pod's volume below dir (paths.Layout.SubPaths), then dir
// and, when empty, its parent volume-subpaths directory: the kubelet's
// CleanSubPaths (pkg/volume/util/subpath doCleanSubPaths), which runs before
// TearDown. A subPath mount left behind keeps the volume mounted after
// NodeUnpublishVolume, and the driver's unmount of the target would not
// release it. Only the first level below each container directory is
// unmounted; directories inside a subPath belong to the volume.
func (o *Operations) cleanSubPaths(dir string) error {
	containers, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the subPath mounts of %s: %w", dir, err)
	}
	for _, c := range containers {
		if !c.IsDir() {
			continue
		}
		containerDir := filepath.Join(dir, c.Name())
		mounts, err := os.ReadDir(containerDir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("reading the subPath mounts of %s: %w", containerDir, err)
		}
		for _, m := range mounts {
			// A subPath mount of a file is a file; of a directory, a
			// directory.
			if err := o.cleanupMountPoint(filepath.Join(containerDir, m.Name())); err != nil {
				return fmt.Errorf("cleaning subPath mount: %w", err)
			}
		}
		if err := os.Remove(containerDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", containerDir, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return o.tree.prune(filepath.Dir(dir), filepath.Dir(filepath.Dir(dir)))
}
