package populator

import (
	corev1 "k8s.io/api/core/v1"
	csitranslation "k8s.io/csi-translation-lib"
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
// are; pv is never modified.
func (r *resolver) translateInTree(pv *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	if pv.Spec.CSI != nil || !translator.IsPVMigratable(pv) {
		return pv, nil
	}
	plugin, _ := translator.GetInTreePluginNameFromSpec(pv, nil)
	out, err := translator.TranslateInTreePVToCSI(r.logger, pv)
	if err != nil {
		return nil, invalid("PV %q: translating its in-tree %s volume to CSI: %v", pv.Name, plugin, err)
	}
	r.logger.V(4).Info("Translated an in-tree PV to CSI", "pv", pv.Name, "plugin", plugin,
		"driver", out.Spec.CSI.Driver, "volumeHandle", out.Spec.CSI.VolumeHandle)
	return out, nil
}
