package e2e_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// attachCaps are the capabilities of a plugin that needs ControllerPublish:
// its node calls fail without the publish_context it returned.
func attachCaps() plugin.Capabilities {
	return plugin.Capabilities{StageUnstage: true, ControllerPublish: true}
}

// createAttachment creates the VolumeAttachment the attach/detach
// controller would create for the volume on the fixture's node.
func createAttachment(t *testing.T, f *k8stest.Fixture, driver, handle, pvName string) *storagev1.VolumeAttachment {
	t.Helper()
	va, err := f.Client.StorageV1().VolumeAttachments().Create(t.Context(), &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: volume.AttachmentName(handle, driver, f.NodeName)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver, NodeName: f.NodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating VolumeAttachment: %v", err)
	}
	t.Cleanup(func() {
		_ = f.Client.StorageV1().VolumeAttachments().Delete(t.Context(), va.Name, metav1.DeleteOptions{})
	})
	return va
}

// setAttachmentStatus writes a VolumeAttachment's status, as the external
// attacher does.
func setAttachmentStatus(t *testing.T, f *k8stest.Fixture, va *storagev1.VolumeAttachment, st storagev1.VolumeAttachmentStatus) *storagev1.VolumeAttachment {
	t.Helper()
	cur, err := f.Client.StorageV1().VolumeAttachments().Get(t.Context(), va.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status = st
	out, err := f.Client.StorageV1().VolumeAttachments().UpdateStatus(t.Context(), cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("writing VolumeAttachment status: %v", err)
	}
	return out
}

// controllerPublish attaches the volume in the plugin, as the external
// attacher does, and returns the publish_context.
func controllerPublish(t *testing.T, p *plugintest.Plugin, handle string) map[string]string {
	t.Helper()
	conn, err := p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).ControllerPublishVolume(t.Context(), &csi.ControllerPublishVolumeRequest{
		VolumeId: handle, NodeId: p.NodeID,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	})
	if err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	if len(resp.GetPublishContext()) == 0 {
		t.Fatal("ControllerPublishVolume returned no publish_context")
	}
	return resp.GetPublishContext()
}

// TestAttachRequired checks the wait for attach of a driver whose
// CSIDriver says attachRequired: nothing is staged until the
// VolumeAttachment is attached, its attachmentMetadata reaches NodeStage and
// NodePublish as publish_context, and an attachError is shown on the pod.
func TestAttachRequired(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, true)
	p := startPlugin(t, a, driver, attachCaps())

	t.Run("attached", func(t *testing.T) {
		vol := createVolume(t, p, "attached", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		pvName := "pv-attached-" + f.Namespace
		createBoundClaim(t, f, claim{PVName: pvName, PVCName: "attached", Driver: driver, Handle: vol.ID})
		pod := createPod(t, f, "attached", podVolume{Name: "data", ClaimName: "attached"})

		waitReason(t, f, pod, status.ReasonWaitingForAttach, pvName)
		want := uniqueName(driver, vol.ID)
		// The attach/detach controller must see the volume in use before
		// it is attached, or it may detach it under a staged mount.
		waitInUse(t, f, "lists the volume", func(got []corev1.UniqueVolumeName) bool { return slices.Contains(got, want) })
		va := createAttachment(t, f, driver, vol.ID, pvName)
		waitReason(t, f, pod, status.ReasonWaitingForAttach, "not attached yet")
		if calls := volumeCalls(t, p, vol.ID); len(calls) != 0 {
			t.Fatalf("node calls before the volume was attached: %q", methods(calls))
		}

		pc := controllerPublish(t, p, vol.ID)
		setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: pc})
		waitReady(t, f, pod)
		calls := volumeCalls(t, p, vol.ID)
		if got := methods(calls); !slices.Equal(got, []string{nodeStage + "=OK", nodePublish + "=OK"}) {
			t.Fatalf("calls = %q, want NodeStageVolume then NodePublishVolume", got)
		}
		for _, c := range calls {
			if !maps.Equal(c.Begin.PublishContext, pc) {
				t.Errorf("%s publish_context = %v, want the attachmentMetadata %v", c.Begin.Method, c.Begin.PublishContext, pc)
			}
		}

		// The volume stays in volumesInUse until it is unstaged, so that
		// the attach/detach controller never detaches it under a mount.
		const unstageDelay = 2 * time.Second
		if err := p.SetFaults(plugin.FaultRule{Method: nodeUnstage, VolumeID: vol.ID, Delay: unstageDelay}); err != nil {
			t.Fatal(err)
		}
		deletePod(t, f, pod)
		waitCalls(t, p, vol.ID, "unstage begun", func(calls []plugin.Call) bool { return countCalls(calls, nodeUnstage) > 0 })
		got, err := volumesInUse(t, f)
		calls = volumeCalls(t, p, vol.ID)
		if unstage := calls[len(calls)-1]; unstage.Begin.Method != nodeUnstage || unstage.Done {
			t.Fatalf("NodeUnstageVolume returned before volumesInUse was read (calls %q); raise unstageDelay", methods(calls))
		}
		if err != nil || !slices.Contains(got, want) {
			t.Errorf("volumesInUse while NodeUnstageVolume runs = %q (err %v), want it to hold %s", got, err, want)
		}
		waitCalls(t, p, vol.ID, "unstage", hasOK(nodeUnstage, 1))
		waitInUse(t, f, "without the volume", func(got []corev1.UniqueVolumeName) bool { return !slices.Contains(got, want) })
		if err := p.ClearFaults(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("attach error", func(t *testing.T) {
		vol := createVolume(t, p, "failing", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		pvName := "pv-failing-" + f.Namespace
		createBoundClaim(t, f, claim{PVName: pvName, PVCName: "failing", Driver: driver, Handle: vol.ID})
		pod := createPod(t, f, "failing", podVolume{Name: "data", ClaimName: "failing"})
		va := createAttachment(t, f, driver, vol.ID, pvName)
		const attachErr = "backend rejected the attach: quota of disks per instance exceeded"
		va = setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{
			AttachError: &storagev1.VolumeError{Time: metav1.Now(), Message: attachErr},
		})
		waitReason(t, f, pod, status.ReasonAttachFailed, pvName, attachErr)
		if calls := volumeCalls(t, p, vol.ID); len(calls) != 0 {
			t.Fatalf("node calls for a volume that failed to attach: %q", methods(calls))
		}

		// The attacher retries and succeeds: the pod gets its volume.
		pc := controllerPublish(t, p, vol.ID)
		setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: pc})
		waitReady(t, f, pod)
		deletePod(t, f, pod)
		waitCalls(t, p, vol.ID, "unstage", hasOK(nodeUnstage, 1))
	})
}
