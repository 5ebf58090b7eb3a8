package source

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	csitranslation "k8s.io/csi-translation-lib"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// inlineTranslator tells which inline in-tree volumes migrate to CSI, as the
// populator's translator does.
var inlineTranslator = csitranslation.New()

// The pod cache keeps of each pod only what the agent reads (issue 24: a
// cached Pod was the largest part of the heap per volume). A pod's
// containers carry images, commands, environment, resources and probes,
// its status the containers' states, its metadata labels, annotations and
// owners: none of it decides a volume. trimPod is the informer's transform,
// so the full object is garbage as soon as it is decoded.
//
// Kept, and who reads it:
//   - metadata: name, namespace, UID and resourceVersion (everything), the
//     deletion timestamp and grace period (the populator: terminating and
//     leaving pods; the pod finalizer);
//   - spec.nodeName (Source.ours);
//   - spec.volumes that may be the agent's: PVC, generic ephemeral, inline
//     CSI and inline in-tree volumes that migrate to CSI; configMap,
//     secret, projected, downwardAPI, emptyDir, hostPath and the like are
//     the runtime's and dropped;
//   - of every init, regular and ephemeral container: its name, the names
//     of its volumeMounts and volumeDevices (which volumes are used, and
//     how), and its seLinuxOptions (the volume's SELinux label);
//   - spec.serviceAccountName (CSI token requests, pod info on mount);
//   - of spec.securityContext: fsGroup, fsGroupChangePolicy, seLinuxOptions
//     and seLinuxChangePolicy;
//   - status.phase (terminal pods) and the agent's own condition
//     (status.ConditionVolumesReady: what it last wrote).
//
// Anything that reads another field of a cached pod must add it here;
// TestTrimPodKeepsWhatIsRead resolves pods with every field set both ways.

// trimPodTransform is the pod informer's transform (cache.TransformFunc):
// it replaces a *corev1.Pod with trimPod's copy and passes anything else
// through. It is idempotent, as client-go requires: a trimmed pod trims to
// itself.
func trimPodTransform(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	if pod == nil {
		return nil, fmt.Errorf("a nil pod")
	}
	return trimPod(pod), nil
}

// trimPod returns a new pod with only the fields the agent reads (see
// above). It shares the kept slices and pointers with pod and changes
// nothing in it.
func trimPod(pod *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:                       pod.Name,
			Namespace:                  pod.Namespace,
			UID:                        pod.UID,
			ResourceVersion:            pod.ResourceVersion,
			DeletionTimestamp:          pod.DeletionTimestamp,
			DeletionGracePeriodSeconds: pod.DeletionGracePeriodSeconds,
		},
		Spec: corev1.PodSpec{
			NodeName:            pod.Spec.NodeName,
			ServiceAccountName:  pod.Spec.ServiceAccountName,
			Volumes:             trimVolumes(pod.Spec.Volumes),
			InitContainers:      trimContainers(pod.Spec.InitContainers),
			Containers:          trimContainers(pod.Spec.Containers),
			EphemeralContainers: trimEphemeralContainers(pod.Spec.EphemeralContainers),
			SecurityContext:     trimPodSecurityContext(pod.Spec.SecurityContext),
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == status.ConditionVolumesReady {
			out.Status.Conditions = []corev1.PodCondition{pod.Status.Conditions[i]}
			break
		}
	}
	return out
}

// trimVolumes keeps the volumes that may be the agent's.
func trimVolumes(vols []corev1.Volume) []corev1.Volume {
	n := 0
	for i := range vols {
		if mayBeOurs(&vols[i]) {
			n++
		}
	}
	if n == len(vols) {
		return vols
	}
	out := make([]corev1.Volume, 0, n)
	for i := range vols {
		if mayBeOurs(&vols[i]) {
			out = append(out, vols[i])
		}
	}
	return out
}

// mayBeOurs tells whether a pod volume is one the populator resolves: a
// PVC, a generic ephemeral volume, an inline CSI volume or an inline
// in-tree volume that migrates to CSI (populator resolve.go).
func mayBeOurs(v *corev1.Volume) bool {
	return v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil || inlineTranslator.IsInlineMigratable(v)
}

// trimContainers keeps each container's name, the names of its volume
// mounts and devices, and its seLinuxOptions.
func trimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i := range cs {
		out[i] = trimContainer(&cs[i])
	}
	return out
}

func trimEphemeralContainers(cs []corev1.EphemeralContainer) []corev1.EphemeralContainer {
	if cs == nil {
		return nil
	}
	out := make([]corev1.EphemeralContainer, len(cs))
	for i := range cs {
		c := corev1.Container(cs[i].EphemeralContainerCommon)
		out[i].EphemeralContainerCommon = corev1.EphemeralContainerCommon(trimContainer(&c))
	}
	return out
}

func trimContainer(c *corev1.Container) corev1.Container {
	out := corev1.Container{Name: c.Name}
	if len(c.VolumeMounts) > 0 {
		out.VolumeMounts = make([]corev1.VolumeMount, len(c.VolumeMounts))
		for i := range c.VolumeMounts {
			out.VolumeMounts[i] = corev1.VolumeMount{Name: c.VolumeMounts[i].Name}
		}
	}
	if len(c.VolumeDevices) > 0 {
		out.VolumeDevices = make([]corev1.VolumeDevice, len(c.VolumeDevices))
		for i := range c.VolumeDevices {
			out.VolumeDevices[i] = corev1.VolumeDevice{Name: c.VolumeDevices[i].Name}
		}
	}
	if sc := c.SecurityContext; sc != nil && sc.SELinuxOptions != nil {
		out.SecurityContext = &corev1.SecurityContext{SELinuxOptions: sc.SELinuxOptions}
	}
	return out
}

// trimPodSecurityContext keeps fsGroup, fsGroupChangePolicy,
// seLinuxOptions and seLinuxChangePolicy.
func trimPodSecurityContext(sc *corev1.PodSecurityContext) *corev1.PodSecurityContext {
	if sc == nil || (sc.FSGroup == nil && sc.FSGroupChangePolicy == nil && sc.SELinuxOptions == nil && sc.SELinuxChangePolicy == nil) {
		return nil
	}
	return &corev1.PodSecurityContext{
		FSGroup:             sc.FSGroup,
		FSGroupChangePolicy: sc.FSGroupChangePolicy,
		SELinuxOptions:      sc.SELinuxOptions,
		SELinuxChangePolicy: sc.SELinuxChangePolicy,
	}
}
