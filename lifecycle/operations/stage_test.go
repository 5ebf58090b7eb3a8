package operations

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestStageSendsTheKubeletRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.setCaps(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	h.vas.set(attached(src, map[string]string{"devicePath": "/dev/sdx"}))
	ctx := testContext(t)

	if err := h.ops.WaitForAttach(ctx, name, src); err != nil {
		t.Fatalf("WaitForAttach: %v", err)
	}
	gid := int64(1000)
	if err := h.ops.Stage(ctx, name, src, &gid); err != nil {
		t.Fatalf("Stage: %v", err)
	}
	stagingDir := filepath.Join(h.root, "plugins/kubernetes.io/csi", testDriver, paths.HandleHash("vol-1"))
	want := &csi.NodeStageVolumeRequest{
		VolumeId:          "vol-1",
		PublishContext:    map[string]string{"devicePath": "/dev/sdx"},
		StagingTargetPath: stagingDir + "/globalmount",
		VolumeCapability: &csi.VolumeCapability{
			// Only AccessModes[0] (ReadWriteOnce) counts.
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
				FsType: "ext4", MountFlags: []string{"noatime", "nodiratime"}, VolumeMountGroup: "1000",
			}},
		},
		Secrets:       map[string]string{"stage-key": "stage-s3cr3t"},
		VolumeContext: map[string]string{"attr": "value"},
	}
	reqs := requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")
	if len(reqs) != 1 {
		t.Fatalf("NodeStageVolume called %d times, want 1", len(reqs))
	}
	if diff := cmp.Diff(want, reqs[0], protocmp.Transform()); diff != "" {
		t.Errorf("NodeStageVolume request (-want +got):\n%s", diff)
	}
	if !slices.Equal(h.secrets.reads, []string{"ns/stage-secret"}) {
		t.Errorf("Secrets read: %v, want only the stage Secret", h.secrets.reads)
	}

	v, _ := h.world.Volume(name)
	if v.Stage != volume.Staged || v.StagingPath != want.StagingTargetPath || !v.Attached || v.LastError != nil {
		t.Errorf("asw volume = %+v, want Staged at %s", v, want.StagingTargetPath)
	}
	rec, err := checkpoint.ReadStage(stagingDir + "/vol_data.json")
	if err != nil {
		t.Fatalf("staged record: %v", err)
	}
	wantRec := checkpoint.StageRecord{VolumeHandle: "vol-1", DriverName: testDriver, VolumeName: name, PVName: "pv-1",
		AccessType: volume.Filesystem, StagingPath: want.StagingTargetPath}
	if rec != wantRec {
		t.Errorf("staged record = %+v, want %+v", rec, wantRec)
	}
	if fi, err := os.Stat(want.StagingTargetPath); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
		t.Errorf("staging directory: %v, %v; want a 0750 directory", fi, err)
	}
	wantObs := []observation{{testDriver, volume.StepWaitForAttach, volume.Filesystem, nil}, {testDriver, volume.StepStage, volume.Filesystem, nil}}
	if got := h.obs.list(); !slices.Equal(got, wantObs) {
		t.Errorf("observed %v, want %v", got, wantObs)
	}
}

func TestStageWithoutMountGroupCapabilitySendsNoGroup(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	src := pvSource()
	gid := int64(1000)
	if err := h.ops.Stage(testContext(t), volume.PersistentName(src.Driver, src.Handle), src, &gid); err != nil {
		t.Fatal(err)
	}
	req := requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")[0]
	if g := req.GetVolumeCapability().GetMount().GetVolumeMountGroup(); g != "" {
		t.Errorf("volume_mount_group = %q without VOLUME_MOUNT_GROUP, want none", g)
	}
	if req.GetPublishContext() != nil {
		t.Errorf("publish_context = %v for a driver without attach, want nil", req.GetPublishContext())
	}
}

func TestAccessModeMapping(t *testing.T) {
	for _, tc := range []struct {
		modes    []string
		snmw     bool
		want     csi.VolumeCapability_AccessMode_Mode
		wantDesc string
	}{
		{nil, false, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "none means RWO"},
		{[]string{"ReadWriteOnce"}, false, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, ""},
		{[]string{"ReadOnlyMany"}, false, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, ""},
		{[]string{"ReadWriteMany"}, false, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, ""},
		{[]string{"ReadWriteOncePod"}, false, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, ""},
		{[]string{"ReadWriteOnce"}, true, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER, ""},
		{[]string{"ReadOnlyMany"}, true, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, ""},
		{[]string{"ReadWriteMany"}, true, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, ""},
		{[]string{"ReadWriteOncePod"}, true, csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, ""},
		{[]string{"ReadWriteMany", "ReadWriteOnce"}, true, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "only the first counts"},
		{[]string{"Bogus"}, false, csi.VolumeCapability_AccessMode_UNKNOWN, ""},
	} {
		src := pvSource()
		src.AccessModes = nil
		for _, m := range tc.modes {
			src.AccessModes = append(src.AccessModes, corev1.PersistentVolumeAccessMode(m))
		}
		caps := csiclient.NewNodeCapabilities()
		if tc.snmw {
			caps = csiclient.NewNodeCapabilities(csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
		}
		if got := capability(src, caps, nil).GetAccessMode().GetMode(); got != tc.want {
			t.Errorf("%v (SINGLE_NODE_MULTI_WRITER %v) %s: %v, want %v", tc.modes, tc.snmw, tc.wantDesc, got, tc.want)
		}
	}
	// Inline volumes are ReadWriteOnce, without mount options; block volumes get access_type block.
	inline := pvSource()
	inline.Inline, inline.AccessModes = true, []corev1.PersistentVolumeAccessMode{corev1.PersistentVolumeAccessMode("ReadWriteMany")}
	c := capability(inline, csiclient.NewNodeCapabilities(), nil)
	if c.GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER || len(c.GetMount().GetMountFlags()) != 0 {
		t.Errorf("inline capability = %v", c)
	}
	block := pvSource()
	block.AccessType = volume.Block
	gid := int64(5)
	c = capability(block, csiclient.NewNodeCapabilities(csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP), &gid)
	if c.GetBlock() == nil || c.GetMount() != nil {
		t.Errorf("block capability = %v, want access_type block only", c)
	}
}

func TestStageWithoutStageUnstageCapability(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	h.setCaps()
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	ctx := testContext(t)

	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatalf("Stage: %v", err)
	}
	if n := len(requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")); n != 0 {
		t.Errorf("NodeStageVolume called %d times for a driver without STAGE_UNSTAGE_VOLUME", n)
	}
	if len(h.secrets.reads) != 0 {
		t.Errorf("stage Secret read without a NodeStageVolume call: %v", h.secrets.reads)
	}
	st, _ := h.ops.Layout().Staging(src.ID)
	if v, _ := h.world.Volume(name); v.Stage != volume.Staged {
		t.Errorf("stage state = %v, want Staged", v.Stage)
	}
	if !exists(t, st.Record) {
		t.Error("the staged record was not kept; the kubelet keeps it for UnmountDevice")
	}

	key := keyOf(src, "uid-a")
	if err := h.ops.Publish(ctx, key, src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if sp := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")[0].GetStagingTargetPath(); sp != "" {
		t.Errorf("staging_target_path = %q without STAGE_UNSTAGE_VOLUME, want none", sp)
	}
	if err := h.ops.Unpublish(ctx, key); err != nil {
		t.Fatalf("Unpublish: %v", err)
	}
	if err := h.ops.Unstage(ctx, name); err != nil {
		t.Fatalf("Unstage: %v", err)
	}
	if n := len(requests[*csi.NodeUnstageVolumeRequest](h, "NodeUnstageVolume")); n != 0 {
		t.Errorf("NodeUnstageVolume called %d times", n)
	}
	wantLeft := []string{"/plugins", "/plugins/kubernetes.io", "/plugins/kubernetes.io/csi", "/pods"}
	if got := treeOf(t, h.root); !slices.Equal(got, wantLeft) {
		t.Errorf("left under the root: %v, want only %v", got, wantLeft)
	}
	if _, ok := h.world.Volume(name); ok {
		t.Error("the volume is still in the actual state after Unstage")
	}
}

// codeClass lists the gRPC codes and the state a first stage or publish
// attempt ends in.
var codeClass = []struct {
	code      codes.Code
	uncertain bool
}{
	{codes.DeadlineExceeded, true},
	{codes.Unavailable, true},
	{codes.Canceled, true},
	{codes.ResourceExhausted, true},
	{codes.Aborted, true},
	{codes.Internal, false},
	{codes.InvalidArgument, false},
	{codes.NotFound, false},
	{codes.FailedPrecondition, false},
	{codes.PermissionDenied, false},
}

func TestStageErrorClasses(t *testing.T) {
	for _, tc := range codeClass {
		t.Run(tc.code.String(), func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			h.noAttach()
			src := pvSource()
			name := volume.PersistentName(src.Driver, src.Handle)
			st, _ := h.ops.Layout().Staging(src.ID)
			ctx := testContext(t)
			h.client.NextNodeStageVolumeErr = status.Error(tc.code, "injected")

			err := h.ops.Stage(ctx, name, src, nil)
			if status.Code(err) != tc.code || errors.Is(err, csiclient.ErrUncertain) != tc.uncertain || csiclient.IsFinal(err) == tc.uncertain {
				t.Fatalf("Stage = %v, want a %v error classified uncertain=%v", err, tc.code, tc.uncertain)
			}
			v, _ := h.world.Volume(name)
			want := volume.NotStaged
			if tc.uncertain {
				want = volume.StageUncertain
			}
			if v.Stage != want || v.LastError == nil || v.LastError.Step != volume.StepStage {
				t.Errorf("asw = %v with last error %+v, want %v with the stage error", v.Stage, v.LastError, want)
			}
			// An uncertain stage keeps its record (it must be torn down); a
			// final one leaves nothing behind.
			if got := exists(t, st.Record); got != tc.uncertain {
				t.Errorf("staged record exists = %v, want %v", got, tc.uncertain)
			}
			if got := exists(t, st.Path); got != tc.uncertain {
				t.Errorf("staging directory exists = %v, want %v", got, tc.uncertain)
			}
			if tc.uncertain && h.world.MayUnstage(name) != nil {
				t.Error("an uncertain stage cannot be unstaged")
			}

			// A final error on top of the uncertain state clears it; a retry succeeds.
			h.client.NextNodeStageVolumeErr = status.Error(codes.Internal, "final")
			_ = h.ops.Stage(ctx, name, src, nil)
			if v, _ := h.world.Volume(name); v.Stage != volume.NotStaged {
				t.Errorf("after a final error: %v, want NotStaged", v.Stage)
			}
			h.client.NextNodeStageVolumeErr = nil
			if err := h.ops.Stage(ctx, name, src, nil); err != nil {
				t.Fatalf("retry: %v", err)
			}
			if v, _ := h.world.Volume(name); v.Stage != volume.Staged || v.LastError != nil {
				t.Errorf("after a successful retry: %+v", v)
			}
			obs := h.obs.list()
			if len(obs) != 3 || obs[0].err == nil || obs[2].err != nil || obs[2].step != volume.StepStage {
				t.Errorf("observations = %v", obs)
			}
		})
	}
}

func TestReconstructedStageStaysUncertainOnFinalError(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	st, _ := h.ops.Layout().Staging(src.ID)
	if err := checkpoint.WriteStage(st.Record, checkpoint.StageRecord{VolumeHandle: src.Handle, DriverName: src.Driver}); err != nil {
		t.Fatal(err)
	}
	h.world.AddReconstructedVolume(name, src.ID, st.Path)
	h.client.NextNodeStageVolumeErr = status.Error(codes.Internal, "final")

	if err := h.ops.Stage(testContext(t), name, src, nil); !csiclient.IsFinal(err) {
		t.Fatalf("Stage = %v, want a final error", err)
	}
	v, _ := h.world.Volume(name)
	if v.Stage != volume.StageUncertain || !v.Reconstructed {
		t.Errorf("reconstructed volume after a final error = %+v, want still uncertain", v)
	}
	if !exists(t, st.Record) {
		t.Error("the staged record of a reconstructed volume was removed after a final error")
	}
}

func TestUnstage(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		wantErr   bool
		wantState volume.StageState
	}{
		{name: "success"},
		{name: "NotFound is already done", err: status.Error(codes.NotFound, "no such volume")},
		{name: "final error", err: status.Error(codes.Internal, "busy"), wantErr: true, wantState: volume.StageUncertain},
		{name: "uncertain error", err: status.Error(codes.DeadlineExceeded, "slow"), wantErr: true, wantState: volume.StageUncertain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			h.noAttach()
			src := pvSource()
			name := volume.PersistentName(src.Driver, src.Handle)
			st, _ := h.ops.Layout().Staging(src.ID)
			ctx := testContext(t)
			if err := h.ops.Stage(ctx, name, src, nil); err != nil {
				t.Fatal(err)
			}
			h.client.NextNodeUnstageVolumeErr = tc.err
			err := h.ops.Unstage(ctx, name)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Unstage = %v, want error %v", err, tc.wantErr)
			}
			reqs := requests[*csi.NodeUnstageVolumeRequest](h, "NodeUnstageVolume")
			wantReq := &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: st.Path}
			if len(reqs) != 1 || !cmp.Equal(reqs[0], wantReq, protocmp.Transform()) {
				t.Errorf("NodeUnstageVolume requests = %v, want [%v]", reqs, wantReq)
			}
			v, ok := h.world.Volume(name)
			if !tc.wantErr {
				if ok || exists(t, st.Record) || exists(t, st.Dir) {
					t.Errorf("after a successful unstage: asw %+v (known %v), record exists %v", v, ok, exists(t, st.Record))
				}
				return
			}
			if v.Stage != tc.wantState || v.LastError == nil || v.LastError.Step != volume.StepUnstage {
				t.Errorf("after a failed unstage: %+v, want %v with the unstage error", v, tc.wantState)
			}
			if !exists(t, st.Record) {
				t.Error("the staged record was removed although NodeUnstageVolume failed")
			}
		})
	}
}

func TestUnstageRefusedWhilePublishPresentOrUncertain(t *testing.T) {
	for _, state := range []volume.PublishState{volume.Published, volume.PublishUncertain} {
		t.Run(state.String(), func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			h.noAttach()
			src := pvSource()
			name := volume.PersistentName(src.Driver, src.Handle)
			ctx := testContext(t)
			if err := h.ops.Stage(ctx, name, src, nil); err != nil {
				t.Fatal(err)
			}
			if state == volume.PublishUncertain {
				h.client.NextNodePublishVolumeErr = status.Error(codes.DeadlineExceeded, "slow")
			}
			_ = h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a"))
			if p, _ := h.world.Pod(keyOf(src, "uid-a")); p.State != state {
				t.Fatalf("publish state = %v, want %v", p.State, state)
			}
			err := h.ops.Unstage(ctx, name)
			if !errors.Is(err, volume.ErrInUse) {
				t.Fatalf("Unstage = %v, want ErrInUse", err)
			}
			if n := len(requests[*csi.NodeUnstageVolumeRequest](h, "NodeUnstageVolume")); n != 0 {
				t.Errorf("NodeUnstageVolume called %d times while published", n)
			}
			if v, _ := h.world.Volume(name); v.Stage != volume.Staged {
				t.Errorf("a refused unstage changed the stage state to %v", v.Stage)
			}
		})
	}
}

func TestUnstageStillMountedStaysUncertain(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	st, _ := h.ops.Layout().Staging(src.ID)
	ctx := testContext(t)
	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	h.mounts.mounted[st.Path] = true // the driver answered OK but left its mount
	err := h.ops.Unstage(ctx, name)
	if !errors.Is(err, ErrStillMounted) {
		t.Fatalf("Unstage = %v, want ErrStillMounted", err)
	}
	if v, _ := h.world.Volume(name); v.Stage != volume.StageUncertain {
		t.Errorf("stage state = %v, want StageUncertain", v.Stage)
	}
	if !exists(t, st.Record) || !exists(t, st.Path) {
		t.Error("record or staging directory removed while still mounted")
	}
}
