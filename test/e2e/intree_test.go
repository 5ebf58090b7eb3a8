package e2e_test

import (
	"fmt"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// ebsDriver is the CSI driver that took over awsElasticBlockStore volumes.
// CSIDriver objects are cluster-wide: only this test may use the name.
const ebsDriver = "ebs.csi.aws.com"

// TestInTreeEBSVolume: an in-tree awsElasticBlockStore PV, which long-lived
// clusters still have, is translated to CSI as the kubelet translates it
// (csi-translation-lib): the agent waits for the VolumeAttachment the
// attach/detach controller names after the translated handle, and the
// test plugin registered as ebs.csi.aws.com stages and publishes the
// translated handle; the node reports the CSI volume in use, and its
// CSINode says the node took over kubernetes.io/aws-ebs.
func TestInTreeEBSVolume(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	createCSIDriver(t, f, ebsDriver, true)
	p := startPlugin(t, a, ebsDriver, nodeCaps())
	vol := createVolume(t, p, "ebs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	pvName := "pv-ebs-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data",
		PVSource: &corev1.PersistentVolumeSource{AWSElasticBlockStore: &corev1.AWSElasticBlockStoreVolumeSource{
			VolumeID: "aws://us-east-1a/" + vol.ID, FSType: "ext4"}}})
	pod := createPod(t, f, "app", podVolume{Name: "data", ClaimName: "data"})

	vaName := volume.AttachmentName(vol.ID, ebsDriver, f.NodeName)
	waitReason(t, f, pod, status.ReasonWaitingForAttach, vaName)
	va := createAttachment(t, f, ebsDriver, vol.ID, pvName)
	setAttachmentStatus(t, f, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/xvdba"}})
	waitReady(t, f, pod)

	calls := volumeCalls(t, p, vol.ID)
	if got := methods(calls); !slices.Equal(got, []string{nodeStage + "=OK", nodePublish + "=OK"}) {
		t.Fatalf("calls for the translated handle %s = %q, want NodeStageVolume then NodePublishVolume", vol.ID, got)
	}
	for _, c := range calls {
		if c.Begin.PublishContext["devicePath"] != "/dev/xvdba" || c.Begin.AccessType != "mount" {
			t.Errorf("%s: publish_context %v, access type %q; want the VolumeAttachment's and mount", c.Begin.Method, c.Begin.PublishContext, c.Begin.AccessType)
		}
	}
	if got := calls[1].Begin.TargetPath; got != publishPaths(a, pod, pvName).Target {
		t.Errorf("target path = %s, want the kubelet's %s", got, publishPaths(a, pod, pvName).Target)
	}
	waitInUse(t, f, "the CSI name of the migrated volume", func(got []corev1.UniqueVolumeName) bool {
		return slices.Contains(got, uniqueName(ebsDriver, vol.ID))
	})
	csiNode, err := f.Client.StorageV1().CSINodes().Get(t.Context(), f.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := csiNode.Annotations[corev1.MigratedPluginsAnnotationKey]; got != "kubernetes.io/aws-ebs" {
		t.Errorf("CSINode annotation %s = %q, want kubernetes.io/aws-ebs", corev1.MigratedPluginsAnnotationKey, got)
	}

	deletePod(t, f, pod)
	waitCalls(t, p, vol.ID, "unstage", hasOK(nodeUnstage, 1))

	// Every step of the translated volume is recorded as the kubelet
	// records a migrated volume's: its CSI driver's plugin, migrated="true".
	// The agent records a step once its CSI call has returned, which may
	// be just after the plugin's journal shows the call: the last one is
	// waited for.
	for _, op := range []string{"verify_controller_attached_volume", "mount_device", "volume_mount", "volume_unmount", "unmount_device"} {
		labels := map[string]string{"volume_plugin": "kubernetes.io/csi:" + ebsDriver, "operation_name": op, "status": "success", "migrated": "true"}
		eventually(t, fmt.Sprintf("a sample of storage_operation_duration_seconds%v", labels), func() (bool, error) {
			return a.metric(t, "storage_operation_duration_seconds", labels).GetHistogram().GetSampleCount() > 0, nil
		})
	}
}
