package populator

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
)

// volumeGIDAnnotation names the group every container of a pod using the
// PV gets as a supplemental group (the kubelet's
// volutil.VolumeGidAnnotationKey).
const volumeGIDAnnotation = "pv.beta.kubernetes.io/gid"

// nodeAffinity checks a PV's nodeAffinity against this node's labels, as
// the kubelet's checkNodeAffinity does before it mounts a volume. nil when
// it matches, or when there is nothing to check (no nodeAffinity, or no
// node labels configured).
func (r *resolver) nodeAffinity(pv *corev1.PersistentVolume) error {
	if pv.Spec.NodeAffinity == nil || r.p.cfg.Node == nil {
		return nil
	}
	labels, ok := r.p.cfg.Node.Labels()
	if !ok {
		return invalid("PV %q has a nodeAffinity and the labels of node %q are not known (no Node object)", pv.Name, r.p.cfg.NodeName)
	}
	if err := storagehelpers.CheckNodeAffinity(pv, labels); err != nil {
		return invalid("PV %q cannot be used on node %q: its nodeAffinity does not match the node's labels: %v", pv.Name, r.p.cfg.NodeName, err)
	}
	return nil
}

// volumeGID returns the PV's pv.beta.kubernetes.io/gid; nil when absent or
// not a number, which the kubelet ignores too.
func (r *resolver) volumeGID(pv *corev1.PersistentVolume) *int64 {
	v, ok := pv.Annotations[volumeGIDAnnotation]
	if !ok {
		return nil
	}
	gid, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		r.logger.V(2).Info("Ignoring a PV's group annotation that is not a number", "pv", pv.Name, "annotation", volumeGIDAnnotation, "value", v)
		return nil
	}
	return &gid
}
