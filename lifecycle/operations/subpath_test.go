package operations

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
)

// subPathWitness is the fake driver, except that NodeUnpublishVolume first
// notes whether the subPath mounts are still there.
type subPathWitness struct {
	*csiclienttest.Client
	mounts      []string
	leftAtCall  []string
	unpublished bool
}

func (w *subPathWitness) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) error {
	w.unpublished = true
	for _, m := range w.mounts {
		if ok, err := mount.New("").IsMountPoint(m); err == nil && ok {
			w.leftAtCall = append(w.leftAtCall, m)
		}
	}
	return w.Client.NodeUnpublishVolume(ctx, req)
}

// TestUnpublishCleansSubPathsFirst: a container runtime's subPath bind
// mounts under pods/<uid>/volume-subpaths/<volume>/<container>/<index>
// (a directory and a file) are unmounted and removed before
// NodeUnpublishVolume, as the kubelet's CleanSubPaths runs before TearDown;
// the data they showed is kept.
func TestUnpublishCleansSubPathsFirst(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount")
	}
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "file"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := &subPathWitness{Client: &csiclienttest.Client{Name: testDriver}}
	h := newHarness(t, harnessOptions{client: w})
	w.Client = h.client
	h.drivers[testDriver] = w
	h.noAttach()
	src := pvSource()
	key := keyOf(src, "uid-a")
	ctx := testContext(t)
	if err := h.ops.Stage(ctx, key.Volume, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Publish(ctx, key, src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	dir, err := h.ops.Layout().SubPaths("uid-a", "pv-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(h.root, "pods/uid-a/volume-subpaths/pv-1"); dir != want {
		t.Fatalf("SubPaths = %s, want %s", dir, want)
	}
	dirMount, fileMount := filepath.Join(dir, "app", "0"), filepath.Join(dir, "app", "1")
	if err := os.MkdirAll(dirMount, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fileMount, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	for m, from := range map[string]string{dirMount: data, fileMount: filepath.Join(data, "file")} {
		if err := unix.Mount(from, m, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mounting %s: %v", m, err)
		}
		t.Cleanup(func() { _ = unix.Unmount(m, unix.MNT_DETACH) })
	}
	w.mounts = []string{dirMount, fileMount}

	if err := h.ops.Unpublish(ctx, key); err != nil {
		t.Fatalf("Unpublish: %v", err)
	}
	if !w.unpublished {
		t.Fatal("NodeUnpublishVolume was not called")
	}
	if len(w.leftAtCall) > 0 {
		t.Errorf("subPath mounts still mounted when NodeUnpublishVolume was called: %v", w.leftAtCall)
	}
	if exists(t, filepath.Join(h.root, "pods/uid-a/volume-subpaths")) {
		t.Errorf("volume-subpaths directory left: %v", treeOf(t, filepath.Join(h.root, "pods")))
	}
	if got, err := os.ReadFile(filepath.Join(data, "file")); err != nil || string(got) != "kept" {
		t.Errorf("the volume's data after the cleanup = %q, %v", got, err)
	}
}
