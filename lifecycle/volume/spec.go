package volume

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AccessType is how a volume is presented to a pod.
type AccessType int

const (
	// Filesystem volumes are mounted (volumeMounts).
	Filesystem AccessType = iota + 1
	// Block volumes are mapped as devices (volumeDevices).
	Block
)

func (a AccessType) String() string {
	switch a {
	case Filesystem:
		return "Filesystem"
	case Block:
		return "Block"
	}
	return "Unknown"
}

// SecretRef names a Secret whose keys become a CSI request's secrets.
type SecretRef struct {
	Namespace string
	Name      string
}

// ID is what a volume is on its driver: the part of a Source that the
// actual state, the on-disk records and the paths all carry, so that each
// names the volume the same way and whichever records it first records it
// whole.
type ID struct {
	// Driver is the CSI driver name.
	Driver string
	// Handle is the CSI volume_id.
	Handle string
	// PVName is the PersistentVolume's name; empty for inline volumes.
	PVName string
	// AccessType is Filesystem or Block.
	AccessType AccessType
}

// Source is what a volume is, independent of the pods that use it: the CSI
// source of its PersistentVolume, or a pod's CSI inline volume. Two pods
// using the same Name see the same Source.
type Source struct {
	// ID names the volume on its driver.
	ID
	// Inline marks a CSI inline (ephemeral) volume.
	Inline bool
	// Migrated marks an in-tree volume (a PV's or a pod's inline
	// awsElasticBlockStore, gcePersistentDisk, …) translated to its CSI
	// driver: the kubelet's volume.Spec.Migrated, the migrated label of
	// storage_operation_duration_seconds.
	Migrated bool
	// AccessModes are the PV's access modes; the kubelet uses only the first.
	AccessModes []corev1.PersistentVolumeAccessMode
	// FSType is the PV's (or inline volume's) fsType.
	FSType string
	// MountOptions are the PV's mountOptions (none for inline volumes).
	MountOptions []string
	// Attributes is volumeAttributes, the base of volume_context.
	Attributes map[string]string
	// StageSecret, PublishSecret and ExpandSecret name the Secrets of
	// nodeStageSecretRef, nodePublishSecretRef and nodeExpandSecretRef.
	StageSecret, PublishSecret, ExpandSecret *SecretRef
	// CapacityBytes is the PV's spec.capacity, for in-use expansion; 0 if unknown.
	CapacityBytes int64
	// SELinuxContext is the SELinux label the volume is mounted with
	// (-o context=..., at stage and publish), agreed by every pod that uses
	// it; empty mounts without one. Only PVs of drivers whose CSIDriver has
	// seLinuxMount get one, on SELinux hosts (see lifecycle/populator).
	SELinuxContext string
	// GID is the PV's pv.beta.kubernetes.io/gid annotation: a group the
	// containers of every pod using the volume get as a supplemental group
	// (the kubelet's GetExtraSupplementalGroupsForPod); nil when absent or
	// not a number.
	GID *int64
}

// PodInfo is what the lifecycle knows of a pod that uses volumes.
type PodInfo struct {
	UID            types.UID
	Namespace      string
	Name           string
	ServiceAccount string
}

// PodVolume is one pod's use of a volume: what publish needs on top of the
// Source.
type PodVolume struct {
	Pod PodInfo
	// SpecName is pod.spec.volumes[].name.
	SpecName string
	// ReadOnly is persistentVolumeClaim.readOnly (or csi.readOnly inline).
	ReadOnly bool
	// FSGroup is the pod's securityContext.fsGroup.
	FSGroup *int64
	// FSGroupChangePolicy is the pod's securityContext.fsGroupChangePolicy:
	// OnRootMismatch skips the recursive ownership change of a volume whose
	// root already has the group; nil or Always walks every time.
	FSGroupChangePolicy *corev1.PodFSGroupChangePolicy
}

// PublishName is the directory name of the volume under the pod's volume
// directory: the PV name for PersistentVolumes, the spec name for inline
// volumes (as the kubelet's getTargetPath).
func (p PodVolume) PublishName(src Source) string {
	if src.Inline {
		return p.SpecName
	}
	return src.PVName
}
