package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DirMode is the mode of the directories MkdirAll creates, as the kubelet's.
const DirMode os.FileMode = 0o750

// fileMode is the mode of a record file. Records hold no secrets.
const fileMode os.FileMode = 0o640

// tempPattern names the temporary file a record is written to before it is
// renamed into place: ".<name>.tmp-<random>" beside it.
func tempPattern(path string) string {
	return "." + filepath.Base(path) + ".tmp-*"
}

// WriteFile replaces path with data atomically and durably: data goes to a
// temporary file in the same directory, which is fsynced, renamed over path,
// and the directory is fsynced. After a crash, path holds either the old or
// the new content, never a mix. Missing parent directories are created with
// MkdirAll.
func WriteFile(path string, data []byte) error {
	return writeFile(path, data, true)
}

// ReplaceFile replaces path with data atomically but not durably: as
// WriteFile without any fsync. A killed agent finds the old or the new
// content (the kernel keeps both writes and the rename); only a power loss
// may take the new one back. Missing parent directories are created
// without fsync either.
func ReplaceFile(path string, data []byte) error {
	return writeFile(path, data, false)
}

func writeFile(path string, data []byte, durable bool) (err error) {
	dir := filepath.Dir(path)
	if durable {
		err = MkdirAll(dir)
	} else {
		err = os.MkdirAll(dir, DirMode)
	}
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		return fmt.Errorf("creating temporary file for %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := f.Chmod(fileMode); err != nil {
		f.Close()
		return fmt.Errorf("setting the mode of %s: %w", tmp, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("syncing %s: %w", tmp, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp, path, err)
	}
	if !durable {
		return nil
	}
	return syncDir(dir)
}

// Remove deletes the record at path, and any temporary file a write of it
// left behind when the agent died, and fsyncs the directory. A missing
// record is not an error.
func Remove(path string) error {
	dir := filepath.Dir(path)
	leftovers, err := filepath.Glob(filepath.Join(dir, tempPattern(path)))
	if err != nil {
		return fmt.Errorf("listing temporary files of %s: %w", path, err)
	}
	removed := false
	for _, p := range append(leftovers, path) {
		switch err := os.Remove(p); {
		case err == nil:
			removed = true
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("removing %s: %w", p, err)
		}
	}
	if !removed {
		return nil
	}
	return syncDir(dir)
}

// RemoveEmptyDirs removes dir and then its parents while they are empty and
// strictly below stop. Missing directories are skipped; the first directory
// that is not empty ends the removal without error.
func RemoveEmptyDirs(dir, stop string) error {
	stop = filepath.Clean(stop)
	for d := filepath.Clean(dir); strings.HasPrefix(d, stop+string(filepath.Separator)); d = filepath.Dir(d) {
		err := os.Remove(d)
		switch {
		case err == nil, errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
			return nil
		default:
			return fmt.Errorf("removing %s: %w", d, err)
		}
	}
	return nil
}

// RecordLeftovers says whether dir holds nothing but what a record file
// named like record leaves: the record and its temporary files.
func RecordLeftovers(dir, record string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	base := filepath.Base(record)
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || (name != base && !strings.HasPrefix(name, "."+base+".tmp-")) {
			return false, nil
		}
	}
	return true, nil
}

// MkdirAll creates dir and its missing parents with DirMode, fsyncing the
// parent of every directory it creates, so the new entries survive a crash.
// An existing directory is fine; an existing non-directory is an error.
func MkdirAll(dir string) error {
	var missing []string
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("creating directory %s: %s is not a directory", dir, p)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("creating directory %s: %w", dir, err)
		}
		missing = append(missing, p)
		if parent := filepath.Dir(p); parent == p {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], DirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating directory %s: %w", missing[i], err)
		}
		if err := syncDir(filepath.Dir(missing[i])); err != nil {
			return err
		}
	}
	return nil
}

// syncDir fsyncs a directory so that entries created, renamed or removed in
// it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening directory %s to sync it: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}
