package plugin_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestFuseVolumeBreaksWithThePluginAndIsRepairedByStageAndPublish is what a FUSE-based driver does
// to a node: its staged and published mounts are served by the plugin process, answer ENOTCONN once
// it is killed, and come back only when NodeStageVolume and NodePublishVolume are repeated at the
// same paths after the restart.
func TestFuseVolumeBreaksWithThePluginAndIsRepairedByStageAndPublish(t *testing.T) {
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	caps := plugin.Capabilities{StageUnstage: true, VolumeHealth: true}
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
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
	if _, err := c.NodeStageVolume(t.Context(), stage); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodePublishVolume(t.Context(), publish); err != nil {
		t.Fatal(err)
	}
	if m := mountAt(t, staging); m == nil || m.FSType != "fuse.csitestplugin" {
		t.Fatalf("staging path mount = %+v, want a FUSE mount", m)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o644); err != nil {
		t.Fatalf("writing through the FUSE mount: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(volumePath(t, p, id), "f")); err != nil || string(got) != "x" {
		t.Fatalf("file in the volume's directory = %q, %v", got, err)
	}

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{staging, target} {
		if _, err := os.Stat(path); !errors.Is(err, unix.ENOTCONN) {
			t.Fatalf("stat %s after the plugin died = %v, want ENOTCONN", path, err)
		}
	}
	if err := p.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	c = dial(t, p)
	health, err := c.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: target, StagingTargetPath: staging})
	if err != nil {
		t.Fatal(err)
	}
	if st := health.GetVolumeHealth().GetHealthStatuses(); len(st) != 1 || st[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Errorf("health of the broken volume = %v, want INACCESSIBLE", st)
	}
	// A new process does not revive the mounts by itself.
	if _, err := os.Stat(target); !mount.IsCorruptedMnt(err) {
		t.Fatalf("stat %s after the restart = %v, want still broken", target, err)
	}
	if _, err := c.NodeStageVolume(t.Context(), stage); err != nil {
		t.Fatalf("NodeStageVolume again: %v", err)
	}
	if _, err := c.NodePublishVolume(t.Context(), publish); err != nil {
		t.Fatalf("NodePublishVolume again: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(got) != "x" {
		t.Fatalf("file through the repaired target = %q, %v", got, err)
	}
	if _, err := c.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeUnstageVolume(t.Context(), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{staging, target} {
		if m := mountAt(t, path); m != nil {
			t.Errorf("%s still mounted after teardown: %+v", path, m)
		}
	}
}

// TestExpandControllerThenNode: ControllerExpandVolume grows the volume and asks for node expansion;
// the file system keeps its size in NodeGetVolumeStats until NodeExpandVolume.
func TestExpandControllerThenNode(t *testing.T) {
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	caps := plugin.Capabilities{StageUnstage: true, Expand: true, VolumeStats: true}
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
	c := dial(t, p)
	vol := createVolume(t, c, "grow", plugin.AccessMount, 1<<20)
	id := vol.GetVolumeId()
	if _, err := c.NodeStageVolume(t.Context(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability(plugin.AccessMount)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodePublishVolume(t.Context(), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability(plugin.AccessMount)}); err != nil {
		t.Fatal(err)
	}
	total := func() int64 {
		t.Helper()
		st, err := c.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetUsage()[0].GetTotal()
	}
	ce, err := c.ControllerExpandVolume(t.Context(), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if !ce.GetNodeExpansionRequired() || ce.GetCapacityBytes() != 2<<20 {
		t.Errorf("ControllerExpandVolume = %v, want 2MiB and node expansion required", ce)
	}
	if got := total(); got != 1<<20 {
		t.Errorf("file system size before NodeExpandVolume = %d, want the old 1MiB", got)
	}
	ne, err := c.NodeExpandVolume(t.Context(), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, StagingTargetPath: staging, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if ne.GetCapacityBytes() != 2<<20 || total() != 2<<20 {
		t.Errorf("after NodeExpandVolume: response %v, stats total %d; want 2MiB", ne, total())
	}
	calls, err := p.ReadJournal()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, call := range plugin.Calls(calls) {
		if call.Begin.Method == "NodeExpandVolume" {
			found = call.Begin.RequiredBytes == 2<<20 && call.Begin.VolumePath == target
		}
	}
	if !found {
		t.Errorf("the journal does not show NodeExpandVolume with required bytes and volume path")
	}
}

// TestControlFileHealthAndVolumeLimit: the control file sets a volume's health and replaces the
// node's volume limit at run time.
func TestControlFileHealthAndVolumeLimit(t *testing.T) {
	caps := plugin.Capabilities{StageUnstage: true, VolumeHealth: true, ControllerPublish: true}
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps, MaxVolumesPerNode: 5})
	c := dial(t, p)
	vol := createVolume(t, c, "v", plugin.AccessMount, 1<<20)
	if err := p.SetControl(plugin.FaultConfig{
		VolumeHealth:      map[string]plugin.HealthReport{vol.GetVolumeId(): {Status: "DEGRADED", Reason: "SlowDisk", Message: "latency is high"}},
		MaxVolumesPerNode: ptr.To[int64](0),
	}); err != nil {
		t.Fatal(err)
	}
	h, err := c.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: vol.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if st := h.GetVolumeHealth().GetHealthStatuses(); len(st) != 1 || st[0].GetReason() != "SlowDisk" || st[0].GetStatus() != csi.VolumeHealthErrorType_DEGRADED {
		t.Errorf("health = %v, want DEGRADED SlowDisk", st)
	}
	info, err := c.NodeGetInfo(t.Context(), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetMaxVolumesPerNode() != 0 {
		t.Errorf("max volumes = %d, want the control file's 0", info.GetMaxVolumesPerNode())
	}
	if err := p.SetControl(plugin.FaultConfig{MaxVolumesPerNode: ptr.To[int64](1)}); err != nil {
		t.Fatal(err)
	}
	other := createVolume(t, c, "w", plugin.AccessMount, 1<<20)
	for i, id := range []string{vol.GetVolumeId(), other.GetVolumeId()} {
		_, err := c.ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: p.NodeID, VolumeCapability: capability(plugin.AccessMount)})
		if i == 0 && err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			wantCode(t, err, codes.ResourceExhausted, "ControllerPublishVolume over the new limit")
		}
	}
}
