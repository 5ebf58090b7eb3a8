package operations

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
)

// ErrStillMounted is wrapped by the error of a teardown step that found its
// target or staging path still mounted after the driver said it was done.
// The step stays uncertain and is retried.
var ErrStillMounted = errors.New("still mounted")

// tree creates and prunes the directories under the root. Steps on
// different volumes share parents (pods/<uid>, the driver's directory), so
// creating a directory (and writing a record into it) and pruning empty
// parents must not interleave: creators hold mu shared, pruning holds it
// exclusively.
type tree struct {
	mu     sync.RWMutex
	mounts Mounts
}

// write runs fn, which writes a record into a directory it creates, under
// the creators' lock.
func (t *tree) write(fn func() error) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return fn()
}

// removeMountPoint removes path, a directory or file the driver mounted
// (or created) and should have unmounted. A path still mounted is
// ErrStillMounted and is left alone; a missing path is fine; a non-empty
// directory is an error (never removed recursively: it may hold data).
func (t *tree) removeMountPoint(path string) error {
	mounted, err := t.mounts.IsMountPoint(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("checking whether %s is a mount point: %w", path, err)
	case mounted:
		return fmt.Errorf("%s is %w", path, ErrStillMounted)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// checkUnmounted returns an error wrapping ErrStillMounted when path, which
// belongs to a container orchestrator and is never removed here, is still a
// mount point; a missing path is fine.
func (t *tree) checkUnmounted(path string) error {
	mounted, err := mountedAt(t.mounts, path)
	if err != nil {
		return err
	}
	if mounted {
		return fmt.Errorf("%s is %w", path, ErrStillMounted)
	}
	return nil
}

// mountedAt says whether path is a mount point; a missing path is not.
func mountedAt(m Mounts, path string) (bool, error) {
	mounted, err := m.IsMountPoint(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("checking whether %s is a mount point: %w", path, err)
	}
	return mounted, nil
}

// removeRecordDir removes the record in dir, then dir itself, then every
// parent that became empty, up to but excluding stop.
func (t *tree) removeRecordDir(record, dir, stop string) error {
	if err := checkpoint.Remove(record); err != nil {
		return err
	}
	return t.prune(dir, stop)
}

// prune removes dir and then its parents while they are empty and strictly
// below stop. Missing directories are skipped; the first directory that
// is not empty (it holds another volume's or pod's entries, or files the
// agent did not make) ends the pruning without error.
func (t *tree) prune(dir, stop string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return checkpoint.RemoveEmptyDirs(dir, stop)
}
