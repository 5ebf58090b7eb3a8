package operations

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/mount-utils"
)

func TestPruneStaysBelowStop(t *testing.T) {
	base := t.TempDir()
	stop := filepath.Join(base, "root", "pods")
	tr := &tree{mounts: mount.New("")}
	deep := filepath.Join(stop, "uid", "volumes", "kubernetes.io~csi", "pv")
	sibling := filepath.Join(stop, "uid", "volumes", "kubernetes.io~csi", "other")
	for _, d := range []string{deep, sibling} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.prune(deep, stop); err != nil {
		t.Fatalf("prune: %v", err)
	}
	if exists(t, deep) || !exists(t, sibling) {
		t.Errorf("after prune: %s exists %v (want false), %s exists %v (want true)", deep, exists(t, deep), sibling, exists(t, sibling))
	}
	if err := tr.prune(sibling, stop); err != nil {
		t.Fatal(err)
	}
	if !exists(t, stop) || exists(t, filepath.Join(stop, "uid")) {
		t.Errorf("pruning the last entry must remove up to, but not, %s: %v", stop, treeOf(t, base))
	}
	// A directory outside stop is never touched, however deep, and the
	// caller hears that nothing was removed.
	outside := filepath.Join(base, "elsewhere", "a", "very", "long", "path", "that", "is", "longer", "than", "stop")
	if err := os.MkdirAll(outside, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := tr.prune(outside, stop); err == nil || !exists(t, outside) {
		t.Errorf("prune outside stop: %v (want an error), exists %v", err, exists(t, outside))
	}
}

func TestRemoveMountPoint(t *testing.T) {
	dir := t.TempDir()
	sm := &stillMounted{Interface: mount.New(""), mounted: map[string]bool{}}
	tr := &tree{mounts: sm}
	if err := tr.removeMountPoint(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("missing path: %v", err)
	}
	full := filepath.Join(dir, "full")
	if err := os.MkdirAll(filepath.Join(full, "data"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := tr.removeMountPoint(full); err == nil || !exists(t, filepath.Join(full, "data")) {
		t.Errorf("a non-empty directory: %v; it must be kept, never removed recursively", err)
	}
	sm.mounted[full] = true
	if err := tr.removeMountPoint(full); !errors.Is(err, ErrStillMounted) {
		t.Errorf("a mount point: %v, want ErrStillMounted", err)
	}
}
