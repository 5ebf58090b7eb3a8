package nodeinfo

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	csitranslation "k8s.io/csi-translation-lib"
)

// translator knows which CSI driver takes over which in-tree plugin's
// volumes (CSI migration): the kubelet's own library.
var translator = csitranslation.New()

// migratedPlugins returns, sorted, the in-tree plugins (e.g.
// kubernetes.io/aws-ebs) whose volumes the node's registered CSI drivers
// take over.
func migratedPlugins(drivers []storagev1.CSINodeDriver) []string {
	var out []string
	for _, d := range drivers {
		if !translator.IsMigratedCSIDriverByName(d.Name) {
			continue
		}
		if name, err := translator.GetInTreeNameFromCSIName(d.Name); err == nil {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// setMigratedPlugins sets the storage.alpha.kubernetes.io/migrated-plugins
// annotation of csiNode to the in-tree plugins its registered drivers take
// over, removing it when there is none, as the kubelet's nodeinfomanager
// setMigrationAnnotation does: the attach/detach controller and the
// scheduler read it to handle in-tree volumes as the CSI driver's on this
// node (the attach/detach controller then creates the VolumeAttachment the
// agent waits for). Unlike the kubelet, which lists every plugin whose
// migration is on whatever is installed, it lists only plugins whose CSI
// driver is registered here. It returns whether the annotation changed.
func setMigratedPlugins(csiNode *storagev1.CSINode) bool {
	want := strings.Join(migratedPlugins(csiNode.Spec.Drivers), ",")
	got, had := csiNode.Annotations[corev1.MigratedPluginsAnnotationKey]
	if got == want && (had || want == "") {
		return false
	}
	if want == "" {
		delete(csiNode.Annotations, corev1.MigratedPluginsAnnotationKey)
		return true
	}
	if csiNode.Annotations == nil {
		csiNode.Annotations = map[string]string{}
	}
	csiNode.Annotations[corev1.MigratedPluginsAnnotationKey] = want
	return true
}
