package populator

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// seLinuxContext returns the SELinux context a pod's PersistentVolume is
// mounted with, as the kubelet with SELinuxMount (GA in 1.37) decides it
// (pkg/volume/util GetMountSELinuxLabel and the desired state's
// AddPodToVolume): nothing on a host without SELinux; the containers that
// mount the volume must agree on one label, an error otherwise; no label
// when none of them has SELinux options, when the pod's
// seLinuxChangePolicy is Recursive, or when the driver's CSIDriver has no
// seLinuxMount. Inline volumes are never mounted with a context. With
// Config.SELinuxMountReadWriteOncePodOnly (an API server before 1.37),
// only a PV whose one access mode is ReadWriteOncePod gets one, as the
// kubelet's VolumeSupportsSELinuxMount decides without SELinuxMount.
func (r *resolver) seLinuxContext(spec string, pol volume.Policy, modes []corev1.PersistentVolumeAccessMode) (string, error) {
	t := r.p.cfg.SELinux
	if t == nil || !t.Enabled() {
		return "", nil
	}
	labels := sets.New[string]()
	for _, opts := range containerSELinuxOptions(r.pod, spec) {
		l, err := t.FileLabel(opts)
		if err != nil {
			return "", invalid("failed to construct an SELinux label from the containers' seLinuxOptions %v: %v", *opts, err)
		}
		labels.Insert(l)
	}
	switch {
	case labels.Len() > 1:
		return "", invalid("the containers that mount the volume have different SELinux labels: %s",
			strings.Join(sets.List(labels), ", "))
	case labels.Len() == 0, !pol.SELinuxMount:
		return "", nil
	case r.p.readWriteOncePodOnly() && (len(modes) != 1 || modes[0] != corev1.ReadWriteOncePod):
		return "", nil
	}
	if sc := r.pod.Spec.SecurityContext; sc != nil && sc.SELinuxChangePolicy != nil &&
		*sc.SELinuxChangePolicy == corev1.SELinuxChangePolicyRecursive {
		return "", nil
	}
	l, _ := labels.PopAny()
	return l, nil
}

// readWriteOncePodOnly tells whether only ReadWriteOncePod PVs are
// mounted with an SELinux context (Config.SELinuxMountReadWriteOncePodOnly).
func (p *Populator) readWriteOncePodOnly() bool {
	return p.cfg.SELinuxMountReadWriteOncePodOnly != nil && p.cfg.SELinuxMountReadWriteOncePodOnly()
}

// seLinuxConflict checks that the other pods that use the volume agree on
// its SELinux context (the kubelet's "conflicting SELinux labels of
// volume" error, for drivers with seLinuxMount): one mount cannot have two
// contexts. Operations refuse a publish whose context differs from the
// stage's too, for pods resolved at the same moment.
func (r *resolver) seLinuxConflict(name volume.Name, pvName, context string, pol volume.Policy) error {
	if !pol.SELinuxMount || r.p.cfg.SELinux == nil || !r.p.cfg.SELinux.Enabled() {
		return nil
	}
	for _, uid := range r.p.cfg.DesiredState.VolumePods(name) {
		if uid == r.pod.UID {
			continue
		}
		other, ok := r.p.cfg.DesiredState.PodVolume(volume.PodKey{Volume: name, Pod: uid})
		if ok && other.Source.SELinuxContext != context {
			return invalid("conflicting SELinux labels of volume %s: %q (pod %s/%s) and %q", pvName,
				other.Source.SELinuxContext, other.Volume.Pod.Namespace, other.Volume.Pod.Name, context)
		}
	}
	return nil
}

// containerSELinuxOptions returns the effective seLinuxOptions of every
// container (init, regular and ephemeral) that mounts the pod volume spec:
// the container's own, else the pod's (securitycontext
// DetermineEffectiveSecurityContext); containers with neither are left
// out. Devices get no label.
func containerSELinuxOptions(pod *corev1.Pod, spec string) []*corev1.SELinuxOptions {
	var podOpts *corev1.SELinuxOptions
	if pod.Spec.SecurityContext != nil {
		podOpts = pod.Spec.SecurityContext.SELinuxOptions
	}
	var out []*corev1.SELinuxOptions
	visit := func(c *corev1.Container) {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == spec }) {
			return
		}
		opts := podOpts
		if c.SecurityContext != nil && c.SecurityContext.SELinuxOptions != nil {
			opts = c.SecurityContext.SELinuxOptions
		}
		if opts != nil {
			out = append(out, opts)
		}
	}
	visitContainers(pod, visit)
	return out
}
