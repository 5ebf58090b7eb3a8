package fsgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	gid             = 2345
	fsImmutableFlag = 0x10
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to change groups")
	}
}

// stat returns the group and mode bits of p, without following a link.
func stat(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Gid, st.Mode & 0o7777
}

func mkfile(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("x"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// TestChange gives a tree to the group as the kubelet does and never
// follows a symbolic link out of it.
func TestChange(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	root, outside := filepath.Join(base, "vol"), filepath.Join(base, "outside")
	mkfile(t, filepath.Join(root, "a"), 0o644)
	mkfile(t, filepath.Join(root, "d1", "d2", "b"), 0o600)
	mkfile(t, filepath.Join(root, "setuid"), os.ModeSetuid|0o755)
	mkfile(t, filepath.Join(outside, "secret"), 0o600)
	for link, target := range map[string]string{"to-file": filepath.Join(outside, "secret"), "to-dir": outside, "d1/up": ".."} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var progress atomic.Int64
	res, err := Change(t.Context(), root, gid, Options{Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	// root, a, d1, d2, b, setuid, 3 links
	if res.Files != 9 || progress.Load() != 9 || res.Changed != 9 || res.Failed != 0 || res.Skipped {
		t.Errorf("Result = %+v, progress %d; want 9 files all changed", res, progress.Load())
	}
	for p, want := range map[string]uint32{
		".": 0o2775, "a": 0o664, "d1": 0o2775, "d1/d2": 0o2775, "d1/d2/b": 0o660, "setuid": 0o4775,
	} {
		g, mode := stat(t, filepath.Join(root, p))
		if g != gid || mode != want {
			t.Errorf("%s: group %d mode %#o, want %d %#o", p, g, mode, gid, want)
		}
	}
	for _, link := range []string{"to-file", "to-dir", "d1/up"} {
		if g, _ := stat(t, filepath.Join(root, link)); g != gid {
			t.Errorf("symbolic link %s has group %d, want %d (lchown)", link, g, gid)
		}
	}
	for _, p := range []string{outside, filepath.Join(outside, "secret"), base} {
		if g, _ := stat(t, p); g == gid {
			t.Errorf("%s outside the volume got the group: a symbolic link was followed", p)
		}
	}
	if _, mode := stat(t, filepath.Join(outside, "secret")); mode != 0o600 {
		t.Errorf("the mode of a file outside the volume changed to %#o", mode)
	}

	// Done again, nothing changes.
	again, err := Change(t.Context(), root, gid, Options{})
	if err != nil || again.Changed != 0 || again.Files != 9 {
		t.Errorf("second Change = %+v, %v; want 9 files visited, none changed", again, err)
	}
}

// TestOnRootMismatch skips the walk while the root is in place.
func TestOnRootMismatch(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	mkfile(t, filepath.Join(root, "f"), 0o644)
	if ok, err := RootMatches(root, gid); err != nil || ok {
		t.Fatalf("RootMatches before = %v, %v", ok, err)
	}
	if res, err := Change(t.Context(), root, gid, Options{OnRootMismatch: true}); err != nil || res.Skipped || res.Files != 2 {
		t.Fatalf("first Change = %+v, %v; want a walk of 2 files", res, err)
	}
	if ok, err := RootMatches(root, gid); err != nil || !ok {
		t.Fatalf("RootMatches after = %v, %v", ok, err)
	}
	// A file the root does not show is not seen: that is the policy.
	mkfile(t, filepath.Join(root, "new"), 0o600)
	if err := os.Chown(filepath.Join(root, "new"), 0, 0); err != nil { // not the setgid directory's group
		t.Fatal(err)
	}
	if res, err := Change(t.Context(), root, gid, Options{OnRootMismatch: true}); err != nil || !res.Skipped || res.Files != 0 {
		t.Fatalf("second Change = %+v, %v; want skipped", res, err)
	}
	if g, _ := stat(t, filepath.Join(root, "new")); g == gid {
		t.Error("OnRootMismatch walked although the root matched")
	}
	if err := os.Chmod(root, 0o755); err != nil { // setgid gone: mismatch
		t.Fatal(err)
	}
	if res, err := Change(t.Context(), root, gid, Options{OnRootMismatch: true}); err != nil || res.Skipped || res.Changed != 2 {
		t.Fatalf("Change after the root lost setgid = %+v, %v; want a walk that changes the root and the new file", res, err)
	}
}

// TestInterrupted: a cancelled change stops and leaves the root unchanged,
// so OnRootMismatch walks again next time. Whether the cancel lands before
// the walk ends depends on the scheduler (a loaded CI machine once let the
// walk finish first), so an attempt that finished is repeated; every attempt
// must leave the root unchanged, and one must have stopped midway.
func TestInterrupted(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	const dirs, files = 20, 200
	for d := range dirs {
		for f := range files {
			mkfile(t, filepath.Join(root, fmt.Sprint(d), fmt.Sprint(f)), 0o644)
		}
	}
	const stopAt = int64(500)
	for attempt := 1; attempt <= 5; attempt++ {
		res, err := interruptAt(t, root, stopAt)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("attempt %d: Change = %+v, %v; want context.Canceled", attempt, res, err)
		}
		if g, _ := stat(t, root); g == gid {
			t.Fatalf("attempt %d: the root changed although the walk was interrupted", attempt)
		}
		if ok, _ := RootMatches(root, gid); ok {
			t.Fatalf("attempt %d: RootMatches after an interrupted walk", attempt)
		}
		if res.Files < stopAt {
			t.Fatalf("attempt %d: interrupted after %d files; the cancel came at %d", attempt, res.Files, stopAt)
		}
		if res.Files < dirs*(files+1) {
			return // stopped midway
		}
		t.Logf("attempt %d: the walk visited all %d files before the cancel landed; again", attempt, res.Files)
	}
	t.Error("no attempt stopped the walk midway")
}

// interruptAt runs Change on root and cancels it once it has visited stopAt
// files.
func interruptAt(t *testing.T, root string, stopAt int64) (Result, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var progress atomic.Int64
	var finished atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for progress.Load() < stopAt && !finished.Load() {
			runtime.Gosched() // until the walk is well under way
		}
		cancel()
	}()
	res, err := Change(ctx, root, gid, Options{Progress: &progress, Workers: 2})
	finished.Store(true)
	<-done
	return res, err
}

// TestChangeFailures: a file that cannot be changed is counted and the
// walk goes on, as the kubelet's; a root that is not a directory fails.
func TestChangeFailures(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	mkfile(t, filepath.Join(root, "plain"), 0o644)
	mkfile(t, filepath.Join(root, "immutable"), 0o644)
	// FS_IOC_SETFLAGS with FS_IMMUTABLE_FL (linux/fs.h 0x10): even root
	// cannot chown it.
	f, err := os.Open(filepath.Join(root, "immutable"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, fsImmutableFlag); err != nil {
		f.Close()
		t.Skipf("cannot make a file immutable here: %v", err)
	}
	t.Cleanup(func() { _ = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, 0); f.Close() })
	res, err := Change(t.Context(), root, gid, Options{})
	if err != nil || res.Failed != 1 || res.Files != 3 {
		t.Errorf("Change = %+v, %v; want 3 files, 1 failed, no error", res, err)
	}
	if g, _ := stat(t, filepath.Join(root, "plain")); g != gid {
		t.Error("the walk stopped at the file it could not change")
	}
	if _, err := Change(t.Context(), filepath.Join(root, "plain"), gid, Options{}); !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("Change of a file = %v, want ENOTDIR", err)
	}
	if _, err := Change(t.Context(), filepath.Join(root, "missing"), gid, Options{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Change of a missing root = %v, want not exist", err)
	}
}

// TestChmodWithoutFchmodat2 covers kernels before 6.6: the mode is changed
// through /proc/self/fd of an O_PATH descriptor, and a symbolic link is
// left alone.
func TestChmodWithoutFchmodat2(t *testing.T) {
	dir := t.TempDir()
	mkfile(t, filepath.Join(dir, "f"), 0o600)
	mkfile(t, filepath.Join(dir, "target"), 0o600)
	if err := os.Symlink("target", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	dirFD, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirFD)
	w := &walker{}
	w.noFchmodat2.Store(true)
	if err := w.chmodAt(dirFD, "f", 0o660); err != nil {
		t.Fatal(err)
	}
	if err := w.chmodAt(dirFD, "link", 0o666); err != nil {
		t.Fatal(err)
	}
	if _, mode := stat(t, filepath.Join(dir, "f")); mode != 0o660 {
		t.Errorf("mode = %#o, want 0660", mode)
	}
	if _, mode := stat(t, filepath.Join(dir, "target")); mode != 0o600 {
		t.Errorf("the target of a symbolic link changed to %#o", mode)
	}
}
