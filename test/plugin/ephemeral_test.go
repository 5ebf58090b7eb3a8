package plugin_test

import (
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestInlineVolumeLivesFromFirstPublishToLastUnpublish: a NodePublishVolume
// with csi.storage.k8s.io/ephemeral=true for an unknown volume ID creates the
// volume and mounts it without staging (even with STAGE_UNSTAGE_VOLUME and
// PUBLISH_UNPUBLISH_VOLUME on); it survives a plugin restart, and the
// NodeUnpublishVolume of its last target deletes it; a repeated unpublish
// then gets NotFound, which a CO counts as done.
func TestInlineVolumeLivesFromFirstPublishToLastUnpublish(t *testing.T) {
	work := t.TempDir()
	target := filepath.Join(work, "pod", "mount")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	caps := plugin.AllCapabilities()
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
	c := dial(t, p)
	ctx := t.Context()
	const id = "csi-0123456789abcdef"
	publish := &csi.NodePublishVolumeRequest{
		VolumeId: id, TargetPath: target, VolumeCapability: capability(plugin.AccessMount),
		VolumeContext: map[string]string{plugin.EphemeralContextKey: "true"},
	}

	persistent := &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capability(plugin.AccessMount), StagingTargetPath: work}
	_, err := c.NodePublishVolume(ctx, persistent)
	wantCode(t, err, codes.NotFound, "NodePublishVolume of an unknown volume without the ephemeral flag")

	for range 2 { // idempotent
		if _, err := c.NodePublishVolume(ctx, publish); err != nil {
			t.Fatalf("NodePublishVolume of an inline volume: %v", err)
		}
	}
	if mountAt(t, target) == nil {
		t.Fatalf("%s is not a mount point", target)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o644); err != nil {
		t.Fatalf("writing through the inline volume: %v", err)
	}
	dir := volumePath(t, p, id)
	if _, err := os.Stat(filepath.Join(dir, "f")); err != nil {
		t.Errorf("the file is not in the volume's directory: %v", err)
	}

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c = dial(t, p)
	if vols, err := p.Volumes(); err != nil || len(vols) != 1 || !vols[0].Ephemeral || len(vols[0].Published) != 1 {
		t.Fatalf("after a restart the plugin holds %+v (%v), want the one inline volume, published", vols, err)
	}

	if _, err := c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if exists(t, dir) || exists(t, target) {
		t.Errorf("after the last unpublish: volume directory present %v, target present %v; want neither", exists(t, dir), exists(t, target))
	}
	if vols, err := p.Volumes(); err != nil || len(vols) != 0 {
		t.Errorf("after the last unpublish the plugin holds %+v (%v), want nothing", vols, err)
	}
	_, err = c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	wantCode(t, err, codes.NotFound, "a repeated NodeUnpublishVolume of a deleted inline volume")
}
