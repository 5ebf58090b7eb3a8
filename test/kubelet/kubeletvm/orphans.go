package kubeletvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig"
	"k8s.io/kubernetes/pkg/util/removeall"
	"k8s.io/mount-utils"
)

// removeOrphanedPodDir removes an orphaned pod's directory as the kubelet's
// cleanupOrphanedPodDirs does once the pod's volumes are gone: the volumes
// directory only if it holds nothing but empty directories
// (removeOrphanedPodVolumeDirs), the other subdirectories without crossing
// into another file system, then the pod directory itself.
func removeOrphanedPodDir(mounter mount.Interface, podDir string) error {
	volumes := filepath.Join(podDir, kubeletconfig.DefaultKubeletVolumesDirName)
	if _, err := os.Lstat(volumes); err == nil {
		if err := removeall.RemoveDirsOneFilesystem(mounter, volumes); err != nil {
			return fmt.Errorf("removing the volumes dir: %w", err)
		}
	}
	entries, err := os.ReadDir(podDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == kubeletconfig.DefaultKubeletVolumesDirName {
			return errors.New("volumes subdir was found after it was removed")
		}
		if err := removeall.RemoveAllOneFilesystem(mounter, filepath.Join(podDir, e.Name())); err != nil {
			return err
		}
	}
	return syscall.Rmdir(podDir)
}
