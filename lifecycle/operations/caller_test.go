package operations

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconstruct"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const coPod = types.UID("front-0123456789abcdef0123456789abcdef01234567")

// coRequests returns a CO's stage and publish requests for volume handle,
// at paths below dir (which the CO, not the agent, owns).
func coRequests(dir, handle string) (*csi.NodeStageVolumeRequest, *csi.NodePublishVolumeRequest) {
	c := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4", MountFlags: []string{"noatime"}}},
	}
	stage := &csi.NodeStageVolumeRequest{
		VolumeId: handle, StagingTargetPath: filepath.Join(dir, "staging"), VolumeCapability: c,
		PublishContext: map[string]string{"devicePath": "/dev/co"}, VolumeContext: map[string]string{"k": "v"},
		Secrets: map[string]string{"key": "s3cr3t"},
	}
	publish := &csi.NodePublishVolumeRequest{
		VolumeId: handle, StagingTargetPath: stage.StagingTargetPath, TargetPath: filepath.Join(dir, "target"),
		VolumeCapability: c, Readonly: true, Secrets: map[string]string{"key": "s3cr3t"},
	}
	return stage, publish
}

func TestStageRequestSendsTheCallersRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := testContext(t)
	coDir := t.TempDir()
	req, _ := coRequests(coDir, "vol-1")
	name := volume.PersistentName(testDriver, "vol-1")

	if err := h.ops.StageRequest(ctx, testDriver, req); err != nil {
		t.Fatalf("StageRequest: %v", err)
	}
	reqs := requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")
	if len(reqs) != 1 {
		t.Fatalf("NodeStageVolume called %d times, want 1", len(reqs))
	}
	if diff := cmp.Diff(req, reqs[0], protocmp.Transform()); diff != "" {
		t.Errorf("the driver got a different request than the caller sent (-caller +driver):\n%s", diff)
	}
	v, _ := h.world.Volume(name)
	if v.Stage != volume.Staged || v.StagingPath != req.StagingTargetPath || !v.External || v.Driver != testDriver || v.Handle != "vol-1" {
		t.Errorf("asw volume = %+v, want Staged at the caller's path, External", v)
	}
	cv, err := h.ops.Layout().CallerVolume(testDriver, "vol-1")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := checkpoint.ReadStage(cv.StageRecord)
	want := checkpoint.StageRecord{VolumeHandle: "vol-1", DriverName: testDriver, VolumeName: name, AccessType: volume.Filesystem, StagingPath: req.StagingTargetPath}
	if err != nil || rec != want {
		t.Errorf("staged record = %+v, %v; want %+v", rec, err, want)
	}
	if exists(t, req.StagingTargetPath) {
		t.Error("the agent created the caller's staging path; that is the caller's job")
	}
	if obs := h.obs.list(); len(obs) != 1 || obs[0] != (observation{testDriver, volume.StepStage, volume.Filesystem, nil}) {
		t.Errorf("observations = %+v, want one successful stage", obs)
	}
	if _, err := os.Stat(filepath.Join(h.root, "plugins")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a caller's stage wrote into the kubelet layout: %v", err)
	}
}

func TestStageRequestIsIdempotent(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := testContext(t)
	req, _ := coRequests(t.TempDir(), "vol-1")
	for range 3 {
		if err := h.ops.StageRequest(ctx, testDriver, req); err != nil {
			t.Fatal(err)
		}
	}
	// Only the secrets differ: the same request.
	other := proto.Clone(req).(*csi.NodeStageVolumeRequest)
	other.Secrets = map[string]string{"key": "rotated"}
	if err := h.ops.StageRequest(ctx, testDriver, other); err != nil {
		t.Fatal(err)
	}
	if n := len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 1 {
		t.Errorf("NodeStageVolume called %d times for identical requests, want 1", n)
	}
	// A different capability is the driver's to judge.
	other.VolumeCapability.GetMount().MountFlags = []string{"sync"}
	if err := h.ops.StageRequest(ctx, testDriver, other); err != nil {
		t.Fatal(err)
	}
	if n := len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 2 {
		t.Errorf("NodeStageVolume called %d times, want 2: a different request goes to the driver", n)
	}
}

func TestStageRequestConflicts(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	ctx := testContext(t)
	coDir := t.TempDir()

	// Staged by the reconciler: the CO may not stage it elsewhere.
	src := pvSource()
	if err := h.ops.Stage(ctx, volume.PersistentName(src.Driver, src.Handle), src, nil); err != nil {
		t.Fatal(err)
	}
	req, _ := coRequests(coDir, src.Handle)
	if err := h.ops.StageRequest(ctx, testDriver, req); !errors.Is(err, volume.ErrInUse) {
		t.Errorf("StageRequest of a volume the reconciler staged = %v, want ErrInUse", err)
	}
	if v, _ := h.world.Volume(volume.PersistentName(src.Driver, src.Handle)); v.External || v.LastError != nil {
		t.Errorf("a refused request changed the reconciler's entry: %+v", v)
	}

	// Staged by the CO at one path: not at another.
	req2, _ := coRequests(coDir, "vol-2")
	if err := h.ops.StageRequest(ctx, testDriver, req2); err != nil {
		t.Fatal(err)
	}
	elsewhere := proto.Clone(req2).(*csi.NodeStageVolumeRequest)
	elsewhere.StagingTargetPath = filepath.Join(coDir, "other")
	if err := h.ops.StageRequest(ctx, testDriver, elsewhere); !errors.Is(err, volume.ErrInUse) {
		t.Errorf("StageRequest at a second staging path = %v, want ErrInUse", err)
	}
	// And the reconciler may not take over a volume the CO staged.
	src2 := pvSource()
	src2.Handle = "vol-2"
	if err := h.ops.Stage(ctx, volume.PersistentName(testDriver, "vol-2"), src2, nil); !errors.Is(err, volume.ErrInUse) {
		t.Errorf("the reconciler's Stage of a volume the CO staged = %v, want ErrInUse", err)
	}
	if n := len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 2 {
		t.Errorf("NodeStageVolume called %d times, want 2 (the two first stages)", n)
	}
}

func TestStageRequestOutcomes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := testContext(t)
	req, _ := coRequests(t.TempDir(), "vol-1")
	name := volume.PersistentName(testDriver, "vol-1")
	cv, err := h.ops.Layout().CallerVolume(testDriver, "vol-1")
	if err != nil {
		t.Fatal(err)
	}

	// A final error on a volume nobody knew: the caller has the error, nothing is kept.
	h.client.NextNodeStageVolumeErr = status.Error(codes.InvalidArgument, "bad fs type")
	err = h.ops.StageRequest(ctx, testDriver, req)
	if status.Code(err) != codes.InvalidArgument || !csiclient.IsFinal(err) {
		t.Errorf("StageRequest = %v, want the driver's final InvalidArgument", err)
	}
	if _, ok := h.world.Volume(name); ok || exists(t, cv.StageRecord) {
		t.Errorf("a final error left state (known %v) or a record (%v)", ok, exists(t, cv.StageRecord))
	}

	// An uncertain error: kept as uncertain, and the retry is sent.
	h.client.NextNodeStageVolumeErr = status.Error(codes.DeadlineExceeded, "slow")
	if err := h.ops.StageRequest(ctx, testDriver, req); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("StageRequest = %v, want DeadlineExceeded", err)
	}
	if v, _ := h.world.Volume(name); v.Stage != volume.StageUncertain || !v.External || !exists(t, cv.StageRecord) {
		t.Errorf("after a timeout: asw %+v, record %v; want StageUncertain, External, recorded", v, exists(t, cv.StageRecord))
	}
	h.client.NextNodeStageVolumeErr = nil
	if err := h.ops.StageRequest(ctx, testDriver, req); err != nil {
		t.Fatal(err)
	}
	if v, _ := h.world.Volume(name); v.Stage != volume.Staged {
		t.Errorf("after the retry: %+v, want Staged", v)
	}
	if n := len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 3 {
		t.Errorf("NodeStageVolume called %d times, want 3", n)
	}
}

func TestCallersPublishAndTeardown(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := testContext(t)
	stage, publish := coRequests(t.TempDir(), "vol-1")
	name := volume.PersistentName(testDriver, "vol-1")
	key := volume.PodKey{Volume: name, Pod: coPod}
	if err := h.ops.StageRequest(ctx, testDriver, stage); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := h.ops.PublishRequest(ctx, testDriver, coPod, publish); err != nil {
			t.Fatalf("PublishRequest: %v", err)
		}
	}
	reqs := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")
	if len(reqs) != 1 {
		t.Fatalf("NodePublishVolume called %d times for two identical requests, want 1", len(reqs))
	}
	if diff := cmp.Diff(publish, reqs[0], protocmp.Transform()); diff != "" {
		t.Errorf("the driver got a different request (-caller +driver):\n%s", diff)
	}
	p, _ := h.world.Pod(key)
	if p.State != volume.Published || p.TargetPath != publish.TargetPath || !p.External {
		t.Errorf("asw pod = %+v, want Published at the caller's target, External", p)
	}
	cp, err := h.ops.Layout().CallerPublishing(testDriver, "vol-1", coPod)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := checkpoint.ReadPublish(cp.Record)
	if err != nil || rec.TargetPath != publish.TargetPath || rec.PodUID != coPod || rec.VolumeName != name || rec.DriverName != testDriver {
		t.Errorf("publish record = %+v, %v", rec, err)
	}

	// Stats and expansion only at a path the node knows.
	if _, err := h.ops.VolumeStats(ctx, testDriver, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: "some/path"}); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("VolumeStats at an unknown path = %v, want ErrNotFound", err)
	}
	if _, err := h.ops.VolumeStats(ctx, testDriver, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-9", VolumePath: publish.TargetPath}); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("VolumeStats of an unknown volume = %v, want ErrNotFound", err)
	}
	for _, path := range []string{publish.TargetPath, stage.StagingTargetPath} {
		if _, err := h.ops.VolumeStats(ctx, testDriver, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: path}); err != nil {
			t.Errorf("VolumeStats at %s: %v", path, err)
		}
	}
	if _, err := h.ops.ExpandVolume(ctx, testDriver, &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", VolumePath: publish.TargetPath, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}}); err != nil {
		t.Errorf("ExpandVolume: %v", err)
	}
	if h.client.NodeGetVolumeStatsCallCount != 2 || h.client.NodeExpandVolumeCallCount != 1 {
		t.Errorf("stats/expand reached the driver %d/%d times, want 2/1", h.client.NodeGetVolumeStatsCallCount, h.client.NodeExpandVolumeCallCount)
	}

	// The reconciler's teardown leaves the caller's volume alone.
	if err := h.ops.Unpublish(ctx, key); err != nil {
		t.Errorf("the reconciler's Unpublish of a caller's target: %v", err)
	}
	if err := h.ops.Unstage(ctx, name); err != nil {
		t.Errorf("the reconciler's Unstage of a caller's volume: %v", err)
	}
	// The caller's: unstage waits for the unpublish (the rule), unknown targets are no-ops.
	if err := h.ops.UnstageRequest(ctx, testDriver, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: stage.StagingTargetPath}); !errors.Is(err, volume.ErrInUse) {
		t.Errorf("UnstageRequest while published = %v, want ErrInUse", err)
	}
	if err := h.ops.UnpublishRequest(ctx, testDriver, "front-other", &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: "/elsewhere"}); err != nil {
		t.Errorf("UnpublishRequest of an unknown target: %v", err)
	}
	if h.client.NodeUnpublishVolumeCallCount != 0 || h.client.NodeUnstageVolumeCallCount != 0 {
		t.Fatalf("teardown calls reached the driver too early: %d unpublish, %d unstage", h.client.NodeUnpublishVolumeCallCount, h.client.NodeUnstageVolumeCallCount)
	}
	// A target still mounted after the driver said done stays uncertain.
	h.mounts.mu.Lock()
	h.mounts.mounted[publish.TargetPath] = true
	h.mounts.mu.Unlock()
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: publish.TargetPath}
	if err := h.ops.UnpublishRequest(ctx, testDriver, coPod, unpublish); !errors.Is(err, ErrStillMounted) {
		t.Errorf("UnpublishRequest of a target left mounted = %v, want ErrStillMounted", err)
	}
	if p, _ := h.world.Pod(key); p.State != volume.PublishUncertain || !p.External {
		t.Errorf("asw pod = %+v, want PublishUncertain, External", p)
	}
	h.mounts.mu.Lock()
	delete(h.mounts.mounted, publish.TargetPath)
	h.mounts.mu.Unlock()
	if err := h.ops.UnpublishRequest(ctx, testDriver, coPod, unpublish); err != nil {
		t.Fatalf("UnpublishRequest: %v", err)
	}
	if err := h.ops.UnstageRequest(ctx, testDriver, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Fatalf("UnstageRequest: %v", err)
	}
	if got := treeOf(t, filepath.Join(h.root, "front")); len(got) != 0 {
		t.Errorf("left under <root>/front: %v", got)
	}
	if vs := h.world.Snapshot(); len(vs) != 0 {
		t.Errorf("asw after teardown = %+v, want empty", vs)
	}
	// Nothing to tear down any more: no calls.
	if err := h.ops.UnpublishRequest(ctx, testDriver, coPod, unpublish); err != nil {
		t.Error(err)
	}
	if err := h.ops.UnstageRequest(ctx, testDriver, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Error(err)
	}
	if h.client.NodeUnpublishVolumeCallCount != 2 || h.client.NodeUnstageVolumeCallCount != 1 {
		t.Errorf("teardown calls: %d unpublish, %d unstage; want 2 and 1", h.client.NodeUnpublishVolumeCallCount, h.client.NodeUnstageVolumeCallCount)
	}
	// The same requests after a full teardown go to the driver again.
	if err := h.ops.StageRequest(ctx, testDriver, stage); err != nil {
		t.Fatal(err)
	}
	if n := len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 2 {
		t.Errorf("NodeStageVolume called %d times, want 2: a torn-down stage is not remembered", n)
	}
}

// TestReconstructFrontRecords checks that what the front endpoint staged and
// published is restored from its records after a restart, and torn down
// from there.
func TestReconstructFrontRecords(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := testContext(t)
	stage, publish := coRequests(t.TempDir(), "vol-1")
	if err := h.ops.StageRequest(ctx, testDriver, stage); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.PublishRequest(ctx, testDriver, coPod, publish); err != nil {
		t.Fatal(err)
	}
	_, publish2 := coRequests(t.TempDir(), "vol-2")
	publish2.StagingTargetPath = ""
	if err := h.ops.PublishRequest(ctx, testDriver, "front-2", publish2); err != nil {
		t.Fatal(err)
	}

	// A new agent over the same root: the staging path still mounted, the targets not provably.
	restarted := newHarness(t, harnessOptions{root: h.root})
	restarted.mounts.mounted[stage.StagingTargetPath] = true
	res, err := reconstruct.Run(ctx, restarted.ops.Layout(), restarted.mounts, restarted.world)
	if err != nil || len(res.Failed) != 0 {
		t.Fatalf("reconstruct.Run: %v, %v", err, res.Failed)
	}
	if res.Staged != 1 || res.ProvenStaged != 1 || res.Published != 2 || res.ProvenPublished != 0 {
		t.Errorf("reconstruct.Run = %+v, want 1 staged (proven) and 2 published", res)
	}
	name := volume.PersistentName(testDriver, "vol-1")
	v, _ := restarted.world.Volume(name)
	if v.Stage != volume.Staged || !v.External || v.StagingPath != stage.StagingTargetPath {
		t.Errorf("restored volume = %+v, want Staged, External, at the caller's path", v)
	}
	p, _ := restarted.world.Pod(volume.PodKey{Volume: name, Pod: coPod})
	if p.State != volume.PublishUncertain || !p.External || !p.Reconstructed || p.TargetPath != publish.TargetPath {
		t.Errorf("restored pod = %+v, want PublishUncertain, External, reconstructed", p)
	}
	v2, _ := restarted.world.Volume(volume.PersistentName(testDriver, "vol-2"))
	if v2.Stage != volume.NotStaged || v2.External {
		t.Errorf("volume published without a stage = %+v, want NotStaged", v2)
	}
	// A repeated publish is sent (the state is uncertain), and the teardown works from the records.
	if err := restarted.ops.PublishRequest(ctx, testDriver, coPod, publish); err != nil {
		t.Fatal(err)
	}
	if restarted.client.NodePublishVolumeCallCount != 1 {
		t.Errorf("a repeated publish after the restart reached the driver %d times, want 1", restarted.client.NodePublishVolumeCallCount)
	}
	for _, pod := range []struct {
		uid types.UID
		req *csi.NodePublishVolumeRequest
	}{{coPod, publish}, {"front-2", publish2}} {
		if err := restarted.ops.UnpublishRequest(ctx, testDriver, pod.uid, &csi.NodeUnpublishVolumeRequest{VolumeId: pod.req.VolumeId, TargetPath: pod.req.TargetPath}); err != nil {
			t.Errorf("UnpublishRequest after the restart: %v", err)
		}
	}
	delete(restarted.mounts.mounted, stage.StagingTargetPath)
	if err := restarted.ops.UnstageRequest(ctx, testDriver, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: stage.StagingTargetPath}); err != nil {
		t.Errorf("UnstageRequest after the restart: %v", err)
	}
	if restarted.client.NodeUnpublishVolumeCallCount != 2 || restarted.client.NodeUnstageVolumeCallCount != 1 {
		t.Errorf("teardown after the restart: %d unpublish, %d unstage calls; want 2 and 1",
			restarted.client.NodeUnpublishVolumeCallCount, restarted.client.NodeUnstageVolumeCallCount)
	}
	if got := treeOf(t, filepath.Join(h.root, "front")); len(got) != 0 {
		t.Errorf("left under <root>/front: %v", got)
	}
}

func TestReconstructFrontReportsBadRecords(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := testContext(t)
	stage, _ := coRequests(t.TempDir(), "vol-1")
	if err := h.ops.StageRequest(ctx, testDriver, stage); err != nil {
		t.Fatal(err)
	}
	cv, err := h.ops.Layout().CallerVolume(testDriver, "vol-1")
	if err != nil {
		t.Fatal(err)
	}
	// A record moved to another volume's directory does not match it.
	other, err := h.ops.Layout().CallerVolume(testDriver, "vol-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(other.Dir, 0o750); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(cv.StageRecord)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other.StageRecord, data, 0o640); err != nil {
		t.Fatal(err)
	}
	restarted := newHarness(t, harnessOptions{root: h.root})
	res, err := reconstruct.Run(ctx, restarted.ops.Layout(), restarted.mounts, restarted.world)
	if err != nil || len(res.Failed) != 1 || res.Staged != 1 {
		t.Errorf("reconstruct.Run = %+v, %v; want the good record restored and the moved one failed", res, err)
	}
	if !exists(t, other.StageRecord) {
		t.Error("a record that failed to restore was removed")
	}
}
