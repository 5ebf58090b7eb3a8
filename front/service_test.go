package front_test

import (
	"os"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/csi-volmgr/csi-volmgr/front"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

func TestIdentityAnswersAsTheBackend(t *testing.T) {
	e := start(t, plugin.AllCapabilities())
	ctx := testContext(t)
	conn, err := e.p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	direct := csi.NewIdentityClient(conn)

	wantInfo, err := direct.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		t.Fatalf("GetPluginInfo through the front: %v", err)
	}
	if diff := cmp.Diff(wantInfo, info, protocmp.Transform()); diff != "" || info.GetName() != e.p.Name {
		t.Errorf("GetPluginInfo through the front differs from the backend's (-backend +front):\n%s", diff)
	}
	wantCaps, err := direct.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	caps, err := e.id.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatalf("GetPluginCapabilities through the front: %v", err)
	}
	if diff := cmp.Diff(wantCaps, caps, protocmp.Transform()); diff != "" {
		t.Errorf("GetPluginCapabilities through the front differs (-backend +front):\n%s", diff)
	}
	probe, err := e.id.Probe(ctx, &csi.ProbeRequest{})
	if err != nil || (probe.GetReady() != nil && !probe.GetReady().GetValue()) {
		t.Errorf("Probe through the front = %v, %v; want ready", probe, err)
	}
	if n := len(e.calls(t, "Probe")); n == 0 {
		t.Error("Probe through the front did not probe the backend")
	}
}

func TestProbeBeforeTheBackendRegisters(t *testing.T) {
	regDir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(regDir) })
	stack := startStack(t, "not-yet.csi.example.com", regDir)
	id := csi.NewIdentityClient(dial(t, stack.Endpoint))
	probe, err := id.Probe(testContext(t), &csi.ProbeRequest{})
	if err != nil || probe.GetReady() == nil || probe.GetReady().GetValue() {
		t.Errorf("Probe with no backend registered = %v, %v; want ready=false", probe, err)
	}
	_, err = id.GetPluginInfo(testContext(t), &csi.GetPluginInfoRequest{})
	wantCode(t, "GetPluginInfo with no backend registered", err, codes.Unavailable)
	_, err = csi.NewNodeClient(dial(t, stack.Endpoint)).NodeGetInfo(testContext(t), &csi.NodeGetInfoRequest{})
	wantCode(t, "NodeGetInfo with no backend registered", err, codes.Unavailable)
}

func TestControllerPassesThroughUnchanged(t *testing.T) {
	e := start(t, plugin.AllCapabilities())
	ctx := testContext(t)
	id := e.createVolume(t, "pass-through")

	// The backend's error, code and message, comes back as it went.
	if err := e.p.SetFaults(plugin.FaultRule{Method: "ControllerExpandVolume", Code: codes.OutOfRange, Message: "backend: too big for this pool"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}})
	if st := status.Convert(err); st.Code() != codes.OutOfRange || st.Message() != "backend: too big for this pool" {
		t.Errorf("ControllerExpandVolume through the front = %v, want the backend's OutOfRange and message verbatim", err)
	}
	if err := e.p.ClearFaults(); err != nil {
		t.Fatal(err)
	}
	// The backend checks the arguments: its InvalidArgument, not ours.
	_, err = e.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
	wantCode(t, "DeleteVolume without an ID", err, codes.InvalidArgument)
	if n := len(e.calls(t, "DeleteVolume")); n != 1 {
		t.Errorf("DeleteVolume reached the backend %d times, want 1: the front passes it through unchecked", n)
	}
	got, err := e.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.GetEntries()) != 1 || got.GetEntries()[0].GetVolume().GetVolumeId() != id {
		t.Errorf("ListVolumes through the front = %v, want the one volume", got)
	}
	if _, err := e.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("DeleteVolume through the front: %v", err)
	}
	// GroupController: the test plugin does not serve it; its Unimplemented comes back.
	_, err = csi.NewGroupControllerClient(dial(t, e.stack.Endpoint)).GroupControllerGetCapabilities(ctx, &csi.GroupControllerGetCapabilitiesRequest{})
	wantCode(t, "GroupControllerGetCapabilities", err, codes.Unimplemented)
}

func TestNodeArgumentsAreCheckedFirst(t *testing.T) {
	e := start(t, plugin.AllCapabilities())
	ctx := testContext(t)
	id := e.createVolume(t, "args")
	before := len(e.calls(t, "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeGetVolumeStats", "NodeExpandVolume"))
	stage := e.path("staging")
	for name, call := range map[string]func() error{
		"stage without volume id": func() error {
			_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{StagingTargetPath: stage, VolumeCapability: mountCap()})
			return err
		},
		"stage at a relative path": func() error {
			_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "staging", VolumeCapability: mountCap()})
			return err
		},
		"stage at an unclean path": func() error {
			_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage + "/../x", VolumeCapability: mountCap()})
			return err
		},
		"stage without capability": func() error {
			_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage})
			return err
		},
		"unstage without path": func() error {
			_, err := e.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id})
			return err
		},
		"publish with a NUL in the target": func() error {
			_, err := e.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: "/x\x00y", StagingTargetPath: stage, VolumeCapability: mountCap()})
			return err
		},
		"publish with a relative staging path": func() error {
			_, err := e.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: e.path("t"), StagingTargetPath: "s", VolumeCapability: mountCap()})
			return err
		},
		"unpublish without volume id": func() error {
			_, err := e.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{TargetPath: e.path("t")})
			return err
		},
		"stats without path": func() error {
			_, err := e.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id})
			return err
		},
		"expand without volume id": func() error {
			_, err := e.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumePath: e.path("t")})
			return err
		},
	} {
		wantCode(t, name, call(), codes.InvalidArgument)
	}
	if after := len(e.calls(t, "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeGetVolumeStats", "NodeExpandVolume")); after != before {
		t.Errorf("invalid requests reached the backend: %d node calls before, %d after", before, after)
	}
	if vs := e.stack.World.Snapshot(); len(vs) != 0 {
		t.Errorf("invalid requests left state: %+v", vs)
	}
}

func TestNodeStepsGoThroughTheLifecycle(t *testing.T) {
	e := start(t, plugin.AllCapabilities())
	ctx := testContext(t)
	id := e.createVolume(t, "lifecycle")
	pub, err := e.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: e.p.NodeID, VolumeCapability: mountCap()})
	if err != nil {
		t.Fatalf("ControllerPublishVolume through the front: %v", err)
	}
	staging, target := e.path("staging"), e.path("target")
	name := volume.PersistentName(e.p.Name, id)
	stageReq := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap(),
		PublishContext: pub.GetPublishContext(), Secrets: map[string]string{"token": "s3cr3t"}}
	pubReq := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(),
		PublishContext: pub.GetPublishContext()}

	for i := range 3 {
		if _, err := e.node.NodeStageVolume(ctx, stageReq); err != nil {
			t.Fatalf("NodeStageVolume #%d: %v", i+1, err)
		}
		if _, err := e.node.NodePublishVolume(ctx, pubReq); err != nil {
			t.Fatalf("NodePublishVolume #%d: %v", i+1, err)
		}
	}
	// Identical repeats are answered by the front: the backend saw each once.
	if n := len(e.calls(t, "NodeStageVolume")); n != 1 {
		t.Errorf("NodeStageVolume reached the backend %d times for 3 identical calls, want 1", n)
	}
	if n := len(e.calls(t, "NodePublishVolume")); n != 1 {
		t.Errorf("NodePublishVolume reached the backend %d times for 3 identical calls, want 1", n)
	}
	// A publish that differs (read-only) is the backend's to judge.
	ro := proto.Clone(pubReq).(*csi.NodePublishVolumeRequest)
	ro.Readonly = true
	_, err = e.node.NodePublishVolume(ctx, ro)
	wantCode(t, "read-only NodePublishVolume on a read-write target", err, codes.AlreadyExists)

	// Recorded in the actual state, at the caller's paths, as the caller's.
	v, ok := e.stack.World.Volume(name)
	if !ok || v.Stage != volume.Staged || v.StagingPath != staging || !v.External {
		t.Errorf("asw volume = %+v (known %v), want Staged at %s, External", v, ok, staging)
	}
	key := volume.PodKey{Volume: name, Pod: front.PodUID(target)}
	p, ok := e.stack.World.Pod(key)
	if !ok || p.State != volume.Published || p.TargetPath != target || !p.External {
		t.Errorf("asw pod %s = %+v (known %v), want Published at %s, External", key, p, ok, target)
	}
	// Checkpointed under <root>/front.
	layout := e.stack.Operations.Layout()
	cv, err := layout.CallerVolume(e.p.Name, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := checkpoint.ReadStage(cv.StageRecord); err != nil || rec.StagingPath != staging || rec.VolumeName != name {
		t.Errorf("staged record = %+v, %v; want one for %s at %s", rec, err, name, staging)
	}
	cp, err := layout.CallerPublishing(e.p.Name, id, key.Pod)
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := checkpoint.ReadPublish(cp.Record); err != nil || rec.TargetPath != target || rec.PodUID != key.Pod {
		t.Errorf("publish record = %+v, %v; want one for %s", rec, err, target)
	}
	// Counted as steps.
	if e.steps.count(volume.StepStage, true) != 3 || e.steps.count(volume.StepPublish, true) != 3 || e.steps.count(volume.StepPublish, false) != 1 {
		t.Errorf("observed steps = %+v, want 3 stages, 3 publishes and 1 failed publish", e.steps.steps)
	}

	// Stats and expansion at the known path; a path the node does not know is NotFound.
	if _, err := e.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target}); err != nil {
		t.Errorf("NodeGetVolumeStats at the target: %v", err)
	}
	_, err = e.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: e.path("elsewhere")})
	wantCode(t, "NodeGetVolumeStats at an unknown path", err, codes.NotFound)
	if _, err := e.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}}); err != nil {
		t.Errorf("NodeExpandVolume at the target: %v", err)
	}
	if e.steps.count(volume.StepExpand, true) != 1 {
		t.Errorf("NodeExpandVolume was not observed as a step: %+v", e.steps.steps)
	}

	// Unstage while published: the unstage rule refuses without calling the backend.
	_, err = e.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, "NodeUnstageVolume while published", err, codes.FailedPrecondition)
	if n := len(e.calls(t, "NodeUnstageVolume")); n != 0 {
		t.Errorf("NodeUnstageVolume reached the backend %d times while the volume was published", n)
	}
	// Teardown; repeats, and targets never published, are answered by the front.
	for i := range 2 {
		if _, err := e.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatalf("NodeUnpublishVolume #%d: %v", i+1, err)
		}
	}
	if _, err := e.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: e.path("never")}); err != nil {
		t.Errorf("NodeUnpublishVolume of an unknown target: %v", err)
	}
	for i := range 2 {
		if _, err := e.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume #%d: %v", i+1, err)
		}
	}
	if _, err := e.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "no-such-volume", StagingTargetPath: staging}); err != nil {
		t.Errorf("NodeUnstageVolume of an unknown volume: %v", err)
	}
	if n, m := len(e.calls(t, "NodeUnpublishVolume")), len(e.calls(t, "NodeUnstageVolume")); n != 1 || m != 1 {
		t.Errorf("the backend saw %d NodeUnpublishVolume and %d NodeUnstageVolume calls, want 1 each", n, m)
	}
	if vs := e.stack.World.Snapshot(); len(vs) != 0 {
		t.Errorf("actual state after teardown = %+v, want empty", vs)
	}
	if left, err := os.ReadDir(filepath.Join(e.stack.RootDir, "front")); err != nil || len(left) != 0 {
		t.Errorf("records left under <root>/front after teardown: %v (%v)", left, err)
	}
	// The caller's own directories are the caller's: the staging path stays.
	if _, err := os.Stat(staging); err != nil {
		t.Errorf("the front removed the caller's staging directory: %v", err)
	}
}

func TestNodeCapabilitiesAndInfoAreTheBackends(t *testing.T) {
	e := start(t, plugin.AllCapabilities())
	ctx := testContext(t)
	conn, err := e.p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	direct := csi.NewNodeClient(conn)
	wantCaps, err := direct.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	caps, err := e.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantCaps, caps, protocmp.Transform(), protocmp.SortRepeatedFields(&csi.NodeGetCapabilitiesResponse{}, "capabilities")); diff != "" {
		t.Errorf("NodeGetCapabilities through the front differs (-backend +front):\n%s", diff)
	}
	wantInfo, err := direct.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := e.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantInfo, info, protocmp.Transform()); diff != "" {
		t.Errorf("NodeGetInfo through the front differs (-backend +front):\n%s", diff)
	}
}
