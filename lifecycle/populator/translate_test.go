package populator_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

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
		Migrated:      true,
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

// inTreeInlineVolumes are pod volumes of the seven in-tree plugins that
// csi-translation-lib translates, with the CSI volume each one is.
var inTreeInlineVolumes = []struct {
	volume corev1.Volume
	want   volume.Source
	// readOnly is the pod's use of it.
	readOnly bool
	// refused, when set, is how the reason starts that the pod's volume is
	// refused with instead: the translated volume's name cannot name its
	// directory.
	refused string
}{{
	volume: corev1.Volume{Name: "ebs", VolumeSource: corev1.VolumeSource{AWSElasticBlockStore: &corev1.AWSElasticBlockStoreVolumeSource{
		VolumeID: "aws://us-east-1a/vol-0123456789abcdef0", FSType: "xfs"}}},
	want: volume.Source{Migrated: true, ID: volume.ID{Driver: "ebs.csi.aws.com", Handle: "vol-0123456789abcdef0",
		PVName: "ebs.csi.aws.com-vol-0123456789abcdef0"}, FSType: "xfs", Attributes: map[string]string{"partition": "0"},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
}, {
	volume: corev1.Volume{Name: "gce", VolumeSource: corev1.VolumeSource{GCEPersistentDisk: &corev1.GCEPersistentDiskVolumeSource{
		PDName: "disk-1", FSType: "ext4", ReadOnly: true}}},
	want: volume.Source{Migrated: true, ID: volume.ID{Driver: "pd.csi.storage.gke.io", Handle: "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1",
		PVName: "pd.csi.storage.gke.io-disk-1"}, FSType: "ext4", Attributes: map[string]string{"partition": ""},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}},
	readOnly: true,
}, {
	volume: corev1.Volume{Name: "azuredisk", VolumeSource: corev1.VolumeSource{AzureDisk: &corev1.AzureDiskVolumeSource{
		DiskName: "d1", Kind: ptr.To(corev1.AzureManagedDisk), DataDiskURI: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1"}}},
	want: volume.Source{Migrated: true, ID: volume.ID{Driver: "disk.csi.azure.com", Handle: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1",
		PVName: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1"}, Attributes: map[string]string{"kind": "Managed"},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
	// The translation names the volume after its diskURI, which is
	// absolute: the kubelet escapes it into its directory name, the
	// agent's layout takes no absolute names.
	refused: `in-tree kubernetes.io/azure-disk volume "azuredisk": the name of its CSI volume cannot name the pod's volume directory: ` +
		`invalid name: volume name "/subscriptions/`,
}, {
	volume: corev1.Volume{Name: "azurefile", VolumeSource: corev1.VolumeSource{AzureFile: &corev1.AzureFileVolumeSource{
		SecretName: "azure-secret", ShareName: "share-1"}}},
	want: volume.Source{Migrated: true, ID: volume.ID{Driver: "file.csi.azure.com", Handle: "#azure-secret#share-1#azurefile#" + ns,
		PVName: "#azure-secret#share-1#azurefile#" + ns}, Attributes: map[string]string{"sharename": "share-1"},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
		// The pod's namespace, as the in-tree plugin read it from.
		StageSecret: &volume.SecretRef{Namespace: ns, Name: "azure-secret"}},
}, {
	volume: corev1.Volume{Name: "cinder", VolumeSource: corev1.VolumeSource{Cinder: &corev1.CinderVolumeSource{
		VolumeID: "c-1", FSType: "ext4"}}},
	want: volume.Source{Migrated: true, ID: volume.ID{Driver: "cinder.csi.openstack.org", Handle: "c-1", PVName: "cinder.csi.openstack.org-c-1"},
		FSType: "ext4", Attributes: map[string]string{}, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
}, {
	volume: corev1.Volume{Name: "vsphere", VolumeSource: corev1.VolumeSource{VsphereVolume: &corev1.VsphereVirtualDiskVolumeSource{
		VolumePath: "[ds1] volumes/v1.vmdk", FSType: "ext4"}}},
	want: volume.Source{Migrated: true, ID: volume.ID{Driver: "csi.vsphere.vmware.com", Handle: "[ds1] volumes/v1.vmdk",
		PVName: "csi.vsphere.vmware.com-[ds1] volumes/v1.vmdk"}, FSType: "ext4", Attributes: map[string]string{},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
}, {
	volume: corev1.Volume{Name: "portworx", VolumeSource: corev1.VolumeSource{PortworxVolume: &corev1.PortworxVolumeSource{
		VolumeID: "px-1", FSType: "ext4"}}},
	want: volume.Source{Migrated: true, ID: volume.ID{Driver: "pxd.portworx.com", Handle: "px-1", PVName: "pxd.portworx.com-px-1"},
		FSType: "ext4", Attributes: map[string]string{}, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
}}

// TestInTreeInlineVolumesAreTranslated: a pod volume of an in-tree plugin
// (spec.volumes[].gcePersistentDisk and the six others csi-translation-lib
// knows) is never ignored: as the kubelet, whose in-tree code for them is
// gone (CSI migration GA), it is translated to the CSI PersistentVolume it
// stands for and wanted as that driver's volume, under the translated PV's
// name, and waits for its VolumeAttachment when the driver needs one.
// Used as a device, it is refused with the reason (inline volumes are
// filesystems), and so is one whose translated name cannot name a
// directory (azureDisk).
func TestInTreeInlineVolumesAreTranslated(t *testing.T) {
	for _, tc := range inTreeInlineVolumes {
		t.Run(tc.volume.Name, func(t *testing.T) {
			ctx := testContext(t)
			pod := newPod("p", withVolume(tc.volume), mount(tc.volume.Name))
			blockPod := newPod("b", withVolume(tc.volume), device(tc.volume.Name))
			s := startStack(ctx, t, fakeClient(pod, blockPod), stackOptions{})
			if tc.refused != "" {
				p, _ := s.store.Pod("uid-p")
				if errs := errorsOf(p); len(errs) != 1 || !strings.HasPrefix(errs[0], tc.volume.Name+": "+tc.refused) ||
					!strings.HasSuffix(errs[0], " is absolute") || len(p.Uses) != 0 {
					t.Errorf("uses %v, errors %q; want only %q… is absolute", summarize(p.Uses), errs, tc.refused)
				}
				return
			}

			name := volume.PersistentName(tc.want.Driver, tc.want.Handle)
			u, ok := s.store.PodVolume(volume.PodKey{Volume: name, Pod: "uid-p"})
			if !ok {
				p, _ := s.store.Pod("uid-p")
				t.Fatalf("the %s volume is not desired as %s; uses %v, errors %v", tc.volume.Name, name, summarize(p.Uses), errorsOf(p))
			}
			want := tc.want
			want.AccessType = volume.Filesystem
			if diff := cmp.Diff(want, u.Source); diff != "" {
				t.Errorf("translated Source (-want +got):\n%s", diff)
			}
			if u.Volume.ReadOnly != tc.readOnly || u.Volume.SpecName != tc.volume.Name ||
				u.Volume.PublishName(u.Source) != tc.want.PVName {
				t.Errorf("pod volume = %+v (publish name %q), want read-only %v, spec name %q, published under %q",
					u.Volume, u.Volume.PublishName(u.Source), tc.readOnly, tc.volume.Name, tc.want.PVName)
			}
			// No CSIDriver object: the kubelet's default needs attach.
			refs := s.src.References("uid-p").Attachments
			if want := volume.AttachmentName(tc.want.Handle, tc.want.Driver, node); len(refs) != 1 || refs[0].Name != want {
				t.Errorf("VolumeAttachments waited for = %v, want %s", refs, want)
			}

			p, _ := s.store.Pod("uid-b")
			wantErr := []string{tc.volume.Name + ": in-tree "}
			if got := errorsOf(p); len(got) != 1 || len(p.Uses) != 0 || !strings.HasPrefix(got[0], wantErr[0]) ||
				!strings.HasSuffix(got[0], "has volumeMode Filesystem, but is used in volumeDevices") {
				t.Errorf("pod using it as a device: uses %v, errors %v; want only the volumeMode error", summarize(p.Uses), got)
			}
		})
	}
}
