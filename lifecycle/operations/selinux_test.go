package operations

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const testContextLabel = "system_u:object_r:container_file_t:s0:c1,c2"

// TestSELinuxContextMountOption: a volume with an SELinux context is staged
// and published with context="..." among its mount flags (the kubelet's
// AddSELinuxMountOption), the context is kept in both records and
// presented to the pod; a pod that needs another context waits until the
// volume is staged again.
func TestSELinuxContextMountOption(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.noAttach()
	src := pvSource()
	src.SELinuxContext = testContextLabel
	key := keyOf(src, "uid-a")
	ctx := testContext(t)
	if err := h.ops.Stage(ctx, key.Volume, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Publish(ctx, key, src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	want := []string{"noatime", "nodiratime", `context="` + testContextLabel + `"`}
	stage := requests[*csi.NodeStageVolumeRequest](h, "NodeStageVolume")
	publish := requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")
	if got := stage[0].GetVolumeCapability().GetMount().GetMountFlags(); !slices.Equal(got, want) {
		t.Errorf("NodeStageVolume mount flags = %q, want %q", got, want)
	}
	if got := publish[0].GetVolumeCapability().GetMount().GetMountFlags(); !slices.Equal(got, want) {
		t.Errorf("NodePublishVolume mount flags = %q, want %q", got, want)
	}
	if !slices.Equal(src.MountOptions, []string{"noatime", "nodiratime"}) {
		t.Errorf("the Source's mount options changed: %q", src.MountOptions)
	}
	st, _ := h.ops.Layout().Staging(src.ID)
	if rec, err := checkpoint.ReadStage(st.Record); err != nil || rec.SELinuxMountContext != testContextLabel {
		t.Errorf("staged record = %+v, %v; want the context", rec, err)
	}
	if rec, err := checkpoint.ReadPublish(filepath.Join(h.root, "pods/uid-a/volumes/kubernetes.io~csi/pv-1/vol_data.json")); err != nil ||
		rec.SELinuxMountContext != testContextLabel {
		t.Errorf("publish record = %+v, %v; want the context", rec, err)
	}
	if v, _ := h.world.Volume(key.Volume); v.SELinuxContext != testContextLabel {
		t.Errorf("staged volume's context = %q", v.SELinuxContext)
	}
	if p, _ := h.world.Pod(key); p.Presentation.SELinuxContext != testContextLabel {
		t.Errorf("presented context = %q, want %q", p.Presentation.SELinuxContext, testContextLabel)
	}

	other := src
	other.SELinuxContext = "system_u:object_r:container_file_t:s0:c5,c6"
	if err := h.ops.Publish(ctx, keyOf(src, "uid-b"), other, podVolume("uid-b", "pod-b")); !errors.Is(err, volume.ErrInUse) {
		t.Errorf("Publish with another context = %v, want ErrInUse", err)
	}
	if n := len(requests[*csi.NodePublishVolumeRequest](h, "NodePublishVolume")); n != 1 {
		t.Errorf("NodePublishVolume called %d times, want once", n)
	}
}
