package reconstruct

import (
	"errors"
	"io/fs"

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
