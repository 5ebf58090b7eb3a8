package volumemanager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
func lockRoot(rootDir string) (*rootLock, error) {
	path := LockFile(rootDir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, &ConfigError{Field: "RootDir", Err: fmt.Errorf("%s is not writable: opening the lock file: %w", rootDir, err)}
	}
	// flock locks belong to the open file description: a second open of
	// the same file, in this process or another, conflicts.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &ConfigError{Field: "RootDir", Err: fmt.Errorf("%s is in use by another csi-volmgr: %s is locked (%s)",
				rootDir, path, holderOf(path))}
		}
		return nil, &ConfigError{Field: "RootDir", Err: fmt.Errorf("%s: locking %s: %w", rootDir, path, err)}
	}
	// The holder's PID, for the message of the next agent that tries; not
	// part of the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return &rootLock{f: f}, nil
}

// holderOf describes who holds the lock, from the PID it wrote.
func holderOf(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return "holder unknown"
	}
	return "held by PID " + string(trimNewline(b))
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
