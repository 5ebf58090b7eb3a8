package bench_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

// janitor undoes what a stopped agent left mounted below its root
// directory, as that agent would have: NodeUnpublishVolume for every
// publish target, then NodeUnstageVolume for every staging path, through
// the plugin, so that its records agree and the next agent starts from the
// same plugin state. Only for an agent that did not finish a teardown
// within the cutoff (deletePodsWithin). Whatever is still mounted after
// that is unmounted directly.
func (w *world) janitor(ctx context.Context, tb testing.TB, a *agent) {
	tb.Helper()
	byPV, byHash := map[string]string{}, map[string]string{}
	for _, v := range w.volumes {
		byPV[v.pv] = v.handle
		sum := sha256.Sum256([]byte(v.handle))
		byHash[hex.EncodeToString(sum[:])] = v.handle
	}
	conn, err := w.plugin.Dial()
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	node := csi.NewNodeClient(conn)
	mounts := mountsBelow(tb, a.root)
	// Publish targets (…/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount)
	// first, then staging paths (…/<driver>/<sha256(handle)>/globalmount).
	slices.SortFunc(mounts, func(x, y string) int {
		return compareBool(strings.Contains(x, "/pods/"), strings.Contains(y, "/pods/"))
	})
	var unpublished, unstaged int
	for _, m := range mounts {
		switch {
		case strings.Contains(m, "/pods/") && filepath.Base(m) == "mount":
			if h, ok := byPV[filepath.Base(filepath.Dir(m))]; ok {
				if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: h, TargetPath: m}); err == nil {
					unpublished++
				}
			}
		case filepath.Base(m) == "globalmount":
			if h, ok := byHash[filepath.Base(filepath.Dir(m))]; ok {
				if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: h, StagingTargetPath: m}); err == nil {
					unstaged++
				}
			}
		}
	}
	left := mountsBelow(tb, a.root)
	for _, m := range slices.Backward(left) {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	tb.Logf("janitor: %d unpublished and %d unstaged through the plugin, %d unmounted directly", unpublished, unstaged, len(left))
}

// compareBool orders true before false.
func compareBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case x:
		return -1
	}
	return 1
}
