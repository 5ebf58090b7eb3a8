package reconstruct

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
)

// removeLeftover removes a staged-volume or pod volume directory that has
// no record and nothing else but the record's temporary files, and then
// its parents that became empty, up to stop. A teardown interrupted
// between removing the record and removing the directory leaves one (as
// does a publish whose record could not be written on a full disk,
// interrupted before it cleaned up): nothing in it can be in use, and the
// kubelet too removes such orphaned directories. It returns whether it
// removed the directory; readErr is the error reading the record gave, and
// only a missing record makes a directory a leftover.
func removeLeftover(dir, record, stop string, readErr error) (bool, error) {
	if !errors.Is(readErr, fs.ErrNotExist) {
		return false, nil
	}
	only, err := checkpoint.RecordLeftovers(dir, record)
	if err != nil || !only {
		return false, err
	}
	if err := checkpoint.Remove(record); err != nil {
		return false, err
	}
	return true, checkpoint.RemoveEmptyDirs(dir, stop)
}

// removeEmptyPodDirs removes the pod directories under podsDir that hold
// nothing but empty directories: what a teardown interrupted while it
// pruned a pod's last volume directory leaves (pods/<uid>/volumes/
// kubernetes.io~csi with nothing in it), which no later scan finds as a
// volume (a chaos run's finding). A pod directory is first scanned whole:
// a file, a link or a mount point anywhere below it (a mount point is never
// entered: it may be a volume's data) keeps it entirely. Only then are its
// directories removed, deepest first, with rmdir, which removes no content.
// It returns the pod directories removed.
func removeEmptyPodDirs(podsDir string, mounts Mounts) ([]string, error) {
	entries, err := os.ReadDir(podsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		dir := filepath.Join(podsDir, e.Name())
		var tree []string
		if !e.IsDir() || !onlyEmptyDirs(dir, mounts, &tree) {
			continue
		}
		gone := true
		for _, d := range slices.Backward(tree) {
			if err := os.Remove(d); err != nil {
				gone = false
				break
			}
		}
		if gone {
			removed = append(removed, dir)
		}
	}
	return removed, nil
}

// onlyEmptyDirs says whether dir and everything below it are directories
// that are not mount points, appending them to tree, parents first.
func onlyEmptyDirs(dir string, mounts Mounts, tree *[]string) bool {
	if mp, err := mounts.IsMountPoint(dir); err != nil || mp {
		return false
	}
	*tree = append(*tree, dir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if !e.IsDir() || !onlyEmptyDirs(filepath.Join(dir, e.Name()), mounts, tree) {
			return false
		}
	}
	return true
}
