package volumemanager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// LockFileName is the file under the root directory that the running agent
// holds an exclusive flock(2) on, as the kubelet's --lock-file: two volume
// managers on one root would each tear down what the other set up.
const LockFileName = "csi-volmgr.lock"

// LockFile returns the lock file of the root directory rootDir.
func LockFile(rootDir string) string { return filepath.Join(rootDir, LockFileName) }

// rootLock is the held lock of a root directory.
type rootLock struct{ f *os.File }

// lockRoot takes the lock of rootDir without waiting. Another process (or
// another VolumeManager of this process) that holds it makes it fail with
// an error that names the lock file. The lock goes with the process: a
// killed agent leaves no stale lock behind.
//
// The lock path must be a regular file with one link, or absent (it is
// created, 0600). A symlink, a FIFO, a directory or a file with other
// links is refused without being opened for writing, truncated or
// followed: a link planted in the root directory must not make the agent
// clobber what it points to. The holder's PID is written only once the
// lock is held, on the locked file.
func lockRoot(rootDir string) (*rootLock, error) {
	path := LockFile(rootDir)
	f, err := openLockFile(path)
	if err != nil {
		return nil, &ConfigError{Field: "RootDir", Err: err}
	}
	// flock locks belong to the open file description: a second open of
	// the same file, in this process or another, conflicts.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := holderOf(f)
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &ConfigError{Field: "RootDir", Err: fmt.Errorf("%s is in use by another csi-volmgr: %s is locked (%s)",
				rootDir, path, holder)}
		}
		return nil, &ConfigError{Field: "RootDir", Err: fmt.Errorf("%s: locking %s: %w", rootDir, path, err)}
	}
	// The holder's PID, for the message of the next agent that tries; not
	// part of the lock. Written on the locked descriptor only.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &rootLock{f: f}, nil
}

// openLockFile opens (creating it if absent) the lock file path for
// reading and writing without following a symlink (O_NOFOLLOW) and without
// blocking on a FIFO (O_NONBLOCK), and makes sure it is a regular file with
// one link; it never truncates. O_CLOEXEC: no child inherits the lock.
func openLockFile(path string) (*os.File, error) {
	// Not even opened when it is something else already (opening a
	// device may act on it); the checks on the open file below hold
	// against a swap in between.
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		if fi, lerr := os.Lstat(path); lerr == nil && !fi.Mode().IsRegular() {
			// ELOOP (a symlink), EISDIR, ENXIO...: say what is there.
			return nil, notRegular(path, fi.Mode())
		}
		return nil, fmt.Errorf("%s is not writable: opening the lock file: %w", filepath.Dir(path), &os.PathError{Op: "open", Path: path, Err: err})
	}
	if err := checkLockFD(path, fd); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkLockFD makes sure the open lock file fd is a regular file with one
// link, and puts it back to blocking I/O (O_NONBLOCK was for a FIFO).
func checkLockFD(path string, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("the lock file %s: %w", path, &os.PathError{Op: "fstat", Path: path, Err: err})
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFIFO:
		return notRegular(path, os.ModeNamedPipe)
	case unix.S_IFDIR:
		return notRegular(path, os.ModeDir)
	case unix.S_IFSOCK:
		return notRegular(path, os.ModeSocket)
	case unix.S_IFCHR, unix.S_IFBLK:
		return notRegular(path, os.ModeDevice)
	default:
		return notRegular(path, os.ModeIrregular)
	}
	if st.Nlink > 1 {
		return fmt.Errorf("the lock file %s has %d hard links; refusing to write to a file that is also elsewhere (remove it)", path, st.Nlink)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		return fmt.Errorf("the lock file %s: %w", path, err)
	}
	return nil
}

// notRegular is the error for a lock path that holds something else than
// a regular file.
func notRegular(path string, mode os.FileMode) error {
	what := "not a regular file (" + mode.Type().String() + ")"
	switch {
	case mode&os.ModeSymlink != 0:
		what = "a symlink"
	case mode.IsDir():
		what = "a directory"
	case mode&os.ModeNamedPipe != 0:
		what = "a FIFO"
	case mode&os.ModeSocket != 0:
		what = "a socket"
	case mode&os.ModeDevice != 0:
		what = "a device"
	}
	return fmt.Errorf("the lock file %s is %s, not a regular file; refusing to use it (remove it)", path, what)
}

// holderOf describes who holds the lock, from the PID it wrote in f.
func holderOf(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if b = trimNewline(b[:n]); len(b) == 0 {
		return "holder unknown"
	}
	return "held by PID " + string(b)
}

func trimNewline(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// release gives the lock up; the file stays, as the kubelet's does.
func (l *rootLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Close()
	l.f = nil
}
