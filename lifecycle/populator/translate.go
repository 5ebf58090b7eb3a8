package populator

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	csitranslation "k8s.io/csi-translation-lib"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
)

// translator translates in-tree PersistentVolumes to CSI: the kubelet's
// own library.
var translator = csitranslation.New()

// translateInTree returns the CSI PersistentVolume the kubelet works with
// for a PV of an in-tree plugin whose volumes a CSI driver took over (CSI
// migration, on for every plugin csi-translation-lib knows:
// awsElasticBlockStore, gcePersistentDisk, azureDisk, azureFile, cinder,
// vsphereVolume, portworxVolume): its driver, volume handle (e.g.
// aws://us-east-1a/vol-1 becomes vol-1), fsType, attributes, secrets and
// translated node affinity. The volume's name, the VolumeAttachment the
// attach/detach controller creates for it and the node's volumesInUse are
// then the CSI ones, as for the kubelet. Other PVs are returned as they
// are; pv is never modified. migrated says whether pv was translated.
func (r *resolver) translateInTree(pv *corev1.PersistentVolume) (out *corev1.PersistentVolume, migrated bool, err error) {
	if pv.Spec.CSI != nil || !translator.IsPVMigratable(pv) {
		return pv, false, nil
	}
	plugin, _ := translator.GetInTreePluginNameFromSpec(pv, nil)
	out, err = translator.TranslateInTreePVToCSI(r.logger, pv)
	if err != nil {
		return nil, false, invalid("PV %q: translating its in-tree %s volume to CSI: %v", pv.Name, plugin, err)
	}
	r.logger.V(4).Info("Translated an in-tree PV to CSI", "pv", pv.Name, "plugin", plugin,
		"driver", out.Spec.CSI.Driver, "volumeHandle", out.Spec.CSI.VolumeHandle)
	return out, true, nil
}

// inTreeInline resolves a volume of the pod's spec of one of those in-tree
// plugins (spec.volumes[].gcePersistentDisk and the like) as the kubelet
// does since CSI migration, which removed their in-tree code: translated
// (TranslateInTreeInlineVolumeToCSI, the kubelet's
// csimigration.TranslateInTreeSpecToCSI with InlineVolumeSpecForCSIMigration)
// to the CSI PersistentVolume it stands for, it is staged and published as
// a PV's volume of that driver, under the translated PV's name (the
// kubelet's spec name, and so its target directory), and waits for the
// VolumeAttachment the attach/detach controller creates for it (with the
// inline spec) when the driver needs one. Ignoring it would start the
// pod's containers without their data.
func (r *resolver) inTreeInline(v *corev1.Volume) {
	plugin, _ := translator.GetInTreePluginNameFromSpec(nil, v)
	pv, err := translator.TranslateInTreeInlineVolumeToCSI(r.logger, v, r.pod.Namespace)
	if err != nil {
		r.fail(v.Name, invalid("translating the in-tree %s volume to CSI: %v", plugin, err))
		return
	}
	if err := paths.CheckPublishName(pv.Name); err != nil {
		// The kubelet escapes such a name (an azureDisk's diskURI, which
		// is absolute) into its directory name; the agent's layout does
		// not take absolute names. Refused before anything is staged.
		r.fail(v.Name, invalid("in-tree %s volume %q: the name of its CSI volume cannot name the pod's volume directory: %v",
			plugin, v.Name, err))
		return
	}
	readOnly := false
	if csi := pv.Spec.CSI; csi != nil {
		readOnly = csi.ReadOnly
		r.logger.V(4).Info("Translated an in-tree inline volume to CSI", "specName", v.Name, "plugin", plugin,
			"driver", csi.Driver, "volumeHandle", csi.VolumeHandle)
	}
	r.csiPV(v.Name, pv, readOnly, true, fmt.Sprintf("in-tree %s volume %q", plugin, v.Name))
}
