package operations

import (
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconstruct"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// rebuildFromDisk fills w from the records under l, as reconstruction will:
// every staged record and every pod volume directory, as uncertain.
func rebuildFromDisk(t *testing.T, l paths.Layout, w *asw.World) {
	t.Helper()
	staged, err := l.StagedVolumes()
	if err != nil {
		t.Fatal(err)
	}
	for _, sv := range staged {
		rec, err := checkpoint.ReadStage(sv.Record)
		if err != nil {
			t.Fatal(err)
		}
		w.AddReconstructedVolume(rec.VolumeName, volume.ID{
			Driver: rec.DriverName, Handle: rec.VolumeHandle, PVName: rec.PVName, AccessType: rec.AccessType,
		}, rec.StagingPath)
	}
	pods, err := l.PodVolumes()
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pods {
		rec, err := checkpoint.ReadPublish(pv.Record)
		if err != nil {
			t.Fatal(err)
		}
		w.AddReconstructedPod(volume.PodKey{Volume: rec.VolumeName, Pod: pv.Pod}, volume.ID{
			Driver: rec.DriverName, Handle: rec.VolumeHandle, AccessType: pv.AccessType,
		}, rec.TargetPath)
	}
}

// TestTeardownAfterRestartFromRecordsAlone stages and publishes with one
// Operations, then tears down with a fresh one whose actual state is
// rebuilt from the on-disk records only: no Source is needed.
func TestTeardownAfterRestartFromRecordsAlone(t *testing.T) {
	before := newHarness(t, harnessOptions{})
	before.noAttach()
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	ctx := testContext(t)
	if err := before.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := before.ops.Publish(ctx, key, src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	st, _ := before.ops.Layout().Staging(src.ID)
	pub, _ := before.ops.Layout().Publishing("uid-a", "pv-1", volume.Filesystem)

	// The agent restarts: a new actual state, new Operations, same root.
	after := newHarness(t, harnessOptions{root: before.root})
	rebuildFromDisk(t, after.ops.Layout(), after.world)
	if v, _ := after.world.Volume(name); v.Stage != volume.StageUncertain || v.StagingPath != st.Path || v.Handle != "vol-1" {
		t.Fatalf("rebuilt volume = %+v", v)
	}
	if err := after.ops.Unpublish(ctx, key); err != nil {
		t.Fatalf("Unpublish after restart: %v", err)
	}
	if err := after.ops.Unstage(ctx, name); err != nil {
		t.Fatalf("Unstage after restart: %v", err)
	}
	unpub := requests[*csi.NodeUnpublishVolumeRequest](after, "NodeUnpublishVolume")
	unstage := requests[*csi.NodeUnstageVolumeRequest](after, "NodeUnstageVolume")
	if len(unpub) != 1 || !cmp.Equal(unpub[0], &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: pub.Target}, protocmp.Transform()) {
		t.Errorf("NodeUnpublishVolume after restart = %v", unpub)
	}
	if len(unstage) != 1 || !cmp.Equal(unstage[0], &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: st.Path}, protocmp.Transform()) {
		t.Errorf("NodeUnstageVolume after restart = %v", unstage)
	}
	wantLeft := []string{"/plugins", "/plugins/kubernetes.io", "/plugins/kubernetes.io/csi", "/pods"}
	if got := treeOf(t, before.root); !slices.Equal(got, wantLeft) {
		t.Errorf("left under the root: %v, want %v", got, wantLeft)
	}
}

// TestUnstageAfterCrashBetweenUnpublishAndUnstage is kubernetes#85476: the
// agent died after the last unpublish; only the staged record is left, and
// it is enough to unstage.
func TestUnstageAfterCrashBetweenUnpublishAndUnstage(t *testing.T) {
	before := newHarness(t, harnessOptions{})
	before.noAttach()
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	ctx := testContext(t)
	if err := before.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := before.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	if err := before.ops.Unpublish(ctx, keyOf(src, "uid-a")); err != nil {
		t.Fatal(err)
	}

	after := newHarness(t, harnessOptions{root: before.root})
	rebuildFromDisk(t, after.ops.Layout(), after.world)
	if got := after.world.VolumeNames(); !slices.Equal(got, []volume.Name{name}) {
		t.Fatalf("volumes found after restart: %v, want the staged one", got)
	}
	if err := after.ops.Unstage(ctx, name); err != nil {
		t.Fatalf("Unstage: %v", err)
	}
	if n := len(requests[*csi.NodeUnstageVolumeRequest](after, "NodeUnstageVolume")); n != 1 {
		t.Errorf("NodeUnstageVolume called %d times, want 1", n)
	}
}

// TestInlineVolumeAfterRestartIsNeverUnstaged: reconstruction finds an
// inline (ephemeral) volume's publish record and must not make up a stage
// for it. Before the fix the rebuilt volume was StageUncertain and its
// teardown sent a NodeUnstageVolume for a volume that was never staged.
func TestInlineVolumeAfterRestartIsNeverUnstaged(t *testing.T) {
	before := newHarness(t, harnessOptions{})
	pol := volume.DefaultPolicy()
	pol.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}
	before.policies.set(testDriver, pol)
	src := volume.Source{
		ID:     volume.ID{Driver: testDriver, Handle: volume.InlineHandle("uid-a", "scratch"), AccessType: volume.Filesystem},
		Inline: true,
	}
	key := volume.PodKey{Volume: volume.InlineName("uid-a", "scratch"), Pod: "uid-a"}
	pv := podVolume("uid-a", "pod-a")
	pv.SpecName = "scratch"
	ctx := testContext(t)
	if err := before.ops.Publish(ctx, key, src, pv); err != nil {
		t.Fatal(err)
	}

	after := newHarness(t, harnessOptions{root: before.root})
	after.policies.set(testDriver, pol)
	res, err := reconstruct.Run(ctx, after.ops.Layout(), after.mounts, after.world)
	if err != nil || res.Published != 1 || res.Staged != 0 {
		t.Fatalf("reconstruct.Run = %+v, %v; want one publish and no stage", res, err)
	}
	if v, _ := after.world.Volume(key.Volume); v.Stage != volume.NotStaged {
		t.Errorf("reconstructed inline volume stage = %v, want NotStaged", v.Stage)
	}
	if err := after.ops.Unpublish(ctx, key); err != nil {
		t.Fatalf("Unpublish: %v", err)
	}
	if err := after.ops.Unstage(ctx, key.Volume); err != nil {
		t.Fatalf("Unstage: %v", err)
	}
	if n := len(requests[*csi.NodeUnpublishVolumeRequest](after, "NodeUnpublishVolume")); n != 1 {
		t.Errorf("NodeUnpublishVolume called %d times, want 1", n)
	}
	if got := requests[*csi.NodeUnstageVolumeRequest](after, "NodeUnstageVolume"); len(got) != 0 {
		t.Errorf("NodeUnstageVolume sent for an inline volume that was never staged: %v", got)
	}
	if got := after.world.VolumeNames(); len(got) != 0 {
		t.Errorf("volumes left in the actual state: %v", got)
	}
}
