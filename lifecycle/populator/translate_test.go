package populator_test

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// inTree replaces a PV's CSI source by an in-tree one.
func inTree(src corev1.PersistentVolumeSource) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) { pv.Spec.PersistentVolumeSource = src }
}

// TestInTreePVsAreTranslated: PVs of in-tree plugins whose volumes a CSI
// driver took over are translated with csi-translation-lib, as the kubelet
// does: the driver, the handle, the fsType and attributes are the CSI
// ones, and so are the volume's name and its VolumeAttachment. Other
// non-CSI PVs stay refused.
func TestInTreePVsAreTranslated(t *testing.T) {
	ctx := testContext(t)
	ebs := newPV("pv-ebs", "c1", "", inTree(corev1.PersistentVolumeSource{AWSElasticBlockStore: &corev1.AWSElasticBlockStoreVolumeSource{
		VolumeID: "aws://us-east-1a/vol-0123456789abcdef0", FSType: "xfs", Partition: 1}}))
	gce := newPV("pv-gce", "c2", "", inTree(corev1.PersistentVolumeSource{GCEPersistentDisk: &corev1.GCEPersistentDiskVolumeSource{
		PDName: "disk-1", FSType: "ext4"}}))
	nfs := newPV("pv-nfs", "c3", "", inTree(corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs", Path: "/x"}}))
	pod := newPod("p", withClaim("ebs", "c1"), withClaim("gce", "c2"), withClaim("nfs", "c3"))
	s := startStack(ctx, t, fakeClient(pod, newPVC("c1", "pv-ebs"), ebs, newPVC("c2", "pv-gce"), gce, newPVC("c3", "pv-nfs"), nfs),
		stackOptions{})

	ebsName := volume.PersistentName("ebs.csi.aws.com", "vol-0123456789abcdef0")
	u, ok := s.store.PodVolume(volume.PodKey{Volume: ebsName, Pod: "uid-p"})
	if !ok {
		p, _ := s.store.Pod("uid-p")
		t.Fatalf("the EBS volume is not desired as %s; uses %v, errors %v", ebsName, summarize(p.Uses), errorsOf(p))
	}
	want := volume.Source{
		ID:            volume.ID{Driver: "ebs.csi.aws.com", Handle: "vol-0123456789abcdef0", PVName: "pv-ebs", AccessType: volume.Filesystem},
		AccessModes:   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		FSType:        "xfs",
		Attributes:    map[string]string{"partition": "1"},
		CapacityBytes: 1 << 30,
	}
	if diff := cmp.Diff(want, u.Source); diff != "" {
		t.Errorf("translated EBS Source (-want +got):\n%s", diff)
	}
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: volume.PersistentName("pd.csi.storage.gke.io",
		"projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1"), Pod: "uid-p"}); !ok {
		t.Error("the GCE PD volume is not desired under its translated name")
	}
	var attach []string
	for _, a := range s.src.References("uid-p").Attachments {
		attach = append(attach, a.Name)
	}
	// The attach/detach controller names the VolumeAttachment of a migrated
	// volume from the translated handle and driver (csi_attacher.go Attach).
	wantAttach := []string{
		volume.AttachmentName("vol-0123456789abcdef0", "ebs.csi.aws.com", node),
		volume.AttachmentName("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1", "pd.csi.storage.gke.io", node),
	}
	slices.Sort(attach)
	slices.Sort(wantAttach)
	if diff := cmp.Diff(wantAttach, attach); diff != "" {
		t.Errorf("VolumeAttachments waited for (-want +got):\n%s", diff)
	}
	p, _ := s.store.Pod("uid-p")
	if diff := cmp.Diff([]string{`nfs: PV "pv-nfs" is not a CSI volume`}, errorsOf(p)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
}
