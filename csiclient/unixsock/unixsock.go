// Package unixsock binds unix sockets that only their owner may connect
// to: the agent's API socket and the front endpoint. A unix socket takes
// the mode of the process's umask when it is bound, so a chmod after
// net.Listen leaves a moment in which anyone may connect; changing the
// umask instead changes it for every goroutine of the process. Listen binds
// the socket inside a new directory of mode 0700 next to the final path,
// sets its mode to 0600 there and renames it into place, so that the
// socket is reachable by its owner only from the moment it can be reached
// at all.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
)

// MaxPathLen is the longest path a unix socket address can hold on Linux
// (sun_path is 108 bytes with the terminating NUL).
const MaxPathLen = 107

// Mode is the mode of a socket Listen binds: read and write (connect) for
// its owner only.
const Mode fs.FileMode = 0o600

// Listen binds the unix socket at path with Mode, owned by the process's
// user. A stale socket at path, left by an earlier process, is replaced
// atomically; anything else at path is an error and stays. Closing the
// listener removes the socket, unless another one has replaced it.
func Listen(path string) (net.Listener, error) {
	if len(path) > MaxPathLen {
		return nil, fmt.Errorf("%s is longer than the %d bytes a unix socket path may have", path, MaxPathLen)
	}
	switch fi, err := os.Lstat(path); {
	case err == nil && fi.Mode().Type() != fs.ModeSocket:
		return nil, fmt.Errorf("%s exists and is not a socket", path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	// os.MkdirTemp creates the directory with mode 0700. Its name (".s"
	// and at most 10 digits) and the socket's ("s") together are no longer
	// than the agent's own socket name, csi-volmgr.sock.
	dir, err := os.MkdirTemp(filepath.Dir(path), ".s")
	if err != nil {
		return nil, fmt.Errorf("creating a private directory for the socket %s: %w", path, err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	bound := filepath.Join(dir, "s")
	if len(bound) > MaxPathLen {
		return nil, fmt.Errorf("%s: binding it privately needs %s, longer than the %d bytes a unix socket path may have", path, bound, MaxPathLen)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// The name the listener was bound to goes away with the rename; the
	// wrapper's Close removes the final one.
	l.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		_ = l.Close()
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(bound, Mode); err != nil {
		return fail(err)
	}
	if err := os.Rename(bound, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &listener{UnixListener: l, path: path, file: fi}, nil
}

// listener removes its socket when it is closed, as net.UnixListener does
// for the name it was bound to.
type listener struct {
	*net.UnixListener
	path string
	// file is the socket's file, to leave a socket that replaced it alone.
	file fs.FileInfo
	once sync.Once
}

// Close stops listening and removes the socket if it is still the one
// Listen bound.
func (l *listener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, statErr := os.Lstat(l.path); statErr == nil && os.SameFile(fi, l.file) {
			_ = os.Remove(l.path)
		}
	})
	return err
}
