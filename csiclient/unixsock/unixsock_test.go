package unixsock_test

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/csiclient/unixsock"
)

// TestListenIsPrivateFromTheStart watches the socket's path while it is
// bound again and again: whenever the path exists, it is a socket of mode
// 0600 owned by this process's user. A net.Listen followed by a chmod is
// seen with the umask's mode (0755 under the usual umask 022).
func TestListenIsPrivateFromTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	var stop atomic.Bool
	seen := make(chan error, 1)
	go func() {
		var bad error
		for !stop.Load() {
			fi, err := os.Lstat(path)
			if err != nil {
				continue
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != unixsock.Mode || int(st.Uid) != os.Geteuid() {
				bad = errors.Join(bad, errors.New(fi.Mode().String()))
			}
		}
		seen <- bad
	}()
	for range 300 {
		l, err := unixsock.Listen(path)
		if err != nil {
			stop.Store(true)
			t.Fatal(err)
		}
		_ = l.Close()
	}
	stop.Store(true)
	if err := <-seen; err != nil {
		t.Fatalf("the socket's path was seen with other modes or owners than %v: %v", unixsock.Mode, err)
	}
}

// TestListenReplacesAStaleSocketOnly binds over a socket left by an
// earlier listener, refuses a regular file and leaves it, serves
// connections, leaves no private directory behind and removes the socket
// on Close.
func TestListenReplacesAStaleSocketOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "api.sock")

	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	_ = stale.Close()

	l, err := unixsock.Listen(path)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hi"))
			_ = c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Errorf("read %q, %v", buf, err)
	}
	_ = c.Close()
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %v, want only the socket", entries)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket still there after Close: %v", err)
	}

	if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := unixsock.Listen(path); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file = %v, want an error saying it is not a socket", err)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "data" {
		t.Errorf("the regular file was changed: %q, %v", data, err)
	}
}

// TestListenRejectsLongPaths names the limit instead of failing in bind.
func TestListenRejectsLongPaths(t *testing.T) {
	path := "/" + strings.Repeat("x", unixsock.MaxPathLen)
	if _, err := unixsock.Listen(path); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("Listen(%d bytes) = %v, want an error about the length", len(path), err)
	}
}
