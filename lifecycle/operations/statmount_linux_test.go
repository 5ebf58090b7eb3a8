package operations

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// cachedDir is a FUSE root directory whose attributes the kernel may cache.
type cachedDir struct{ fs.Inode }

func (*cachedDir) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	return 0
}

var _ fs.NodeGetattrer = &cachedDir{}

// TestStatMountSeesADeadFUSEMount: a FUSE mount whose attributes the kernel
// caches (JuiceFS's, and those of most FUSE drivers) answers a stat from the
// cache after its connection died, as when the node plugin that ran its
// daemon is killed; StatMount finds it dead all the same (its statfs gets
// ENOTCONN), so that the mount check and the set-up's repair see it. The
// connection is aborted through the fusectl file system, as the kernel
// aborts it when the daemon dies.
func TestStatMountSeesADeadFUSEMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: mounts a FUSE file system (make test runs as root)")
	}
	dir := t.TempDir()
	mnt, ctl := filepath.Join(dir, "m"), filepath.Join(dir, "fusectl")
	for _, d := range []string{mnt, ctl} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hour := time.Hour
	srv, err := fs.Mount(mnt, &cachedDir{}, &fs.Options{AttrTimeout: &hour, EntryTimeout: &hour,
		MountOptions: fuse.MountOptions{DirectMountStrict: true, FsName: "statmount-test", Name: "statmount"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		srv.Wait()
	})
	if _, err := StatMount(mnt); err != nil {
		t.Fatalf("StatMount of the healthy mount: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil {
		t.Fatalf("mount fusectl: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(ctl, 0) })
	abort := filepath.Join(ctl, strconv.FormatUint(uint64(unix.Minor(st.Dev)), 10), "abort")
	if err := os.WriteFile(abort, []byte("1"), 0o200); err != nil {
		t.Fatalf("aborting the FUSE connection: %v", err)
	}

	if _, err := os.Stat(mnt); err != nil {
		t.Fatalf("os.Stat of the dead mount: %v; the kernel was expected to answer it from its attribute cache, which is what this test is about", err)
	}
	_, err = StatMount(mnt)
	if !IsDeadMount(err) || !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("StatMount of the dead mount: %v, want ENOTCONN", err)
	}
}
