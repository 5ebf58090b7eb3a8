package reconstruct

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMountedBelow reads the real mount table: a directory is "mounted
// below" when something is mounted under it, not when only the directory
// itself or a sibling sharing its name as a prefix is; a name with a space
// (which the kernel writes as \040) is found too.
func TestMountedBelow(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	ctx := t.Context()
	root := t.TempDir()
	mountAt := func(p string) {
		t.Helper()
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	}
	for _, name := range []string{"staging", "with space\tand\\tab"} {
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if mountedBelow(ctx, dir) {
			t.Errorf("%q: mounted below before any mount", dir)
		}
		mountAt(dir + "-sibling/dev")
		mountAt(dir)
		if mountedBelow(ctx, dir) {
			t.Errorf("%q: mounted below with only the directory itself and a sibling mounted", dir)
		}
		mountAt(filepath.Join(dir, "dev"))
		if !mountedBelow(ctx, dir) {
			t.Errorf("%q: not mounted below with a mount at %s/dev", dir, dir)
		}
		if !mountedBelow(ctx, dir+"/") {
			t.Errorf("%q: not mounted below when named with a trailing slash", dir+"/")
		}
	}
}
