package plugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestStrictRefusesBrokenTargetAndRecordsTargetsTwice: in strict mode the plugin behaves as stock
// drivers do. A NodePublishVolume over a broken FUSE target fails (Internal, the stat error) until
// the target is unpublished; a target published over while it is not a mount point is recorded
// twice, so one NodeUnpublishVolume leaves NodeUnstageVolume refused, and a second one lets it
// through.
func TestStrictRefusesBrokenTargetAndRecordsTargetsTwice(t *testing.T) {
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	caps := plugin.Capabilities{StageUnstage: true}
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
	if err := p.SetControl(plugin.FaultConfig{Strict: true}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	resp, err := c.CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name: "fuse", VolumeCapabilities: []*csi.VolumeCapability{capability(plugin.AccessMount)},
		Parameters: map[string]string{plugin.FuseParameter: "true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability(plugin.AccessMount)}
	publish := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability(plugin.AccessMount)}
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}
	if _, err := c.NodeStageVolume(t.Context(), stage); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodePublishVolume(t.Context(), publish); err != nil {
		t.Fatal(err)
	}

	// The driver dies: the target is broken, and publishing over it fails.
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	c = dial(t, p)
	if _, err := c.NodeStageVolume(t.Context(), stage); err != nil {
		t.Fatalf("NodeStageVolume again: %v", err)
	}
	_, err = c.NodePublishVolume(t.Context(), publish)
	wantCode(t, err, codes.Internal, "NodePublishVolume over the broken target")
	if err == nil || !strings.Contains(err.Error(), "transport endpoint is not connected") {
		t.Errorf("NodePublishVolume over the broken target: %v, want the stat error", err)
	}
	if _, err := c.NodeUnpublishVolume(t.Context(), unpublish); err != nil {
		t.Fatalf("NodeUnpublishVolume of the broken target: %v", err)
	}
	if _, err := c.NodePublishVolume(t.Context(), publish); err != nil {
		t.Fatalf("NodePublishVolume after the unpublish: %v", err)
	}
	if _, err := os.ReadDir(target); err != nil {
		t.Fatalf("the target after the repair: %v", err)
	}

	// The target unmounted behind the driver's back and published over: recorded twice.
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodePublishVolume(t.Context(), publish); err != nil {
		t.Fatalf("NodePublishVolume over the unmounted target: %v", err)
	}
	if _, err := c.NodeUnpublishVolume(t.Context(), unpublish); err != nil {
		t.Fatal(err)
	}
	_, err = c.NodeUnstageVolume(t.Context(), unstage)
	wantCode(t, err, codes.FailedPrecondition, "NodeUnstageVolume with a target recorded twice and unpublished once")
	if _, err := c.NodeUnpublishVolume(t.Context(), unpublish); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeUnstageVolume(t.Context(), unstage); err != nil {
		t.Fatalf("NodeUnstageVolume once every record is gone: %v", err)
	}
}
