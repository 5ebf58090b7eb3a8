package e2e_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// TestPodWithPVC follows one pod with one PVC through its whole life: the
// volume is staged, then published at the kubelet's target path as a real
// mount of the volume's data, the pod's condition turns True and the Node
// reports the volume in use; deleting the pod unpublishes, then unstages,
// and leaves no directory, record or mount behind.
func TestPodWithPVC(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	p := startPlugin(t, a, driver, nodeCaps())
	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID})
	pod := createPod(t, f, "app", podVolume{Name: "data", ClaimName: "data"})

	c := waitCondition(t, f, pod, "VolumesReady=True", func(c *corev1.PodCondition) bool { return c.Status == corev1.ConditionTrue })
	if c.Reason != "" || c.Message != "" {
		t.Errorf("True condition has reason %q message %q, want none", c.Reason, c.Message)
	}

	pub := publishPaths(a, pod, pvName)
	st := stagingPaths(a, driver, vol.ID)
	mounter := mount.New("")
	for _, mp := range []string{st.Path, pub.Target} {
		if ok, err := mounter.IsMountPoint(mp); err != nil || !ok {
			t.Fatalf("%s is not a mount point (err %v)", mp, err)
		}
	}
	for _, rec := range []string{st.Record, pub.Record} {
		if !exists(rec) {
			t.Errorf("record %s missing while the volume is published", rec)
		}
	}
	// The target shows the volume's data, both ways.
	if err := os.WriteFile(filepath.Join(pub.Target, "written-by-pod"), []byte("hello"), 0o644); err != nil {
		t.Fatalf("writing through the target path: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(vol.Path, "written-by-pod")); err != nil || string(got) != "hello" {
		t.Fatalf("file written through the target, read from the volume's directory = %q, %v; want hello", got, err)
	}
	if err := os.WriteFile(filepath.Join(vol.Path, "written-by-driver"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(pub.Target, "written-by-driver")); err != nil || string(got) != "data" {
		t.Fatalf("file of the volume read through the target = %q, %v; want data", got, err)
	}

	calls := volumeCalls(t, p, vol.ID)
	if got := methods(calls); !slices.Equal(got, []string{nodeStage + "=OK", nodePublish + "=OK"}) {
		t.Fatalf("calls for the volume = %q, want NodeStageVolume then NodePublishVolume", got)
	}
	if !endsBefore(calls[0], calls[1]) {
		t.Errorf("NodePublishVolume began before NodeStageVolume returned")
	}
	if calls[0].Begin.StagingPath != st.Path || calls[1].Begin.StagingPath != st.Path || calls[1].Begin.TargetPath != pub.Target {
		t.Errorf("paths sent: stage %q, publish staging %q target %q; want %q and %q",
			calls[0].Begin.StagingPath, calls[1].Begin.StagingPath, calls[1].Begin.TargetPath, st.Path, pub.Target)
	}
	// The driver needs no attach (attachRequired=false): as the kubelet,
	// which reports attachable volumes only, the agent leaves the volume
	// out of volumesInUse (TestAttachRequired checks the other case).
	if got, err := volumesInUse(t, f); err != nil || len(got) != 0 {
		t.Errorf("volumesInUse with the volume published = %q (err %v), want it empty: the driver needs no attach", got, err)
	}

	deletePod(t, f, pod)
	calls = waitCalls(t, p, vol.ID, "unpublish and unstage", hasOK(nodeUnstage, 1))
	if got := methods(calls); !slices.Equal(got, []string{nodeStage + "=OK", nodePublish + "=OK", nodeUnpublish + "=OK", nodeUnstage + "=OK"}) {
		t.Fatalf("calls for the volume = %q, want stage, publish, unpublish, unstage", got)
	}
	if !endsBefore(calls[2], calls[3]) {
		t.Errorf("NodeUnstageVolume began before NodeUnpublishVolume returned")
	}
	waitGone(t, "pod directory, staging directory and records", filepath.Join(a.Root, "pods", string(pod.UID)), st.Dir, st.Record, pub.Record)
	waitInUse(t, f, "empty", func(got []corev1.UniqueVolumeName) bool { return len(got) == 0 })
	if mounts, err := mountsUnder(a.Root); err != nil || len(mounts) > 0 {
		t.Errorf("mounts left under the root: %v (err %v)", mounts, err)
	}
	if got, err := os.ReadFile(filepath.Join(vol.Path, "written-by-pod")); err != nil || string(got) != "hello" {
		t.Errorf("the volume's data after teardown = %q, %v; want it kept", got, err)
	}
	eventually(t, "agent holds no volume", func() (bool, error) { return len(a.VM.Volumes()) == 0, nil })
}
