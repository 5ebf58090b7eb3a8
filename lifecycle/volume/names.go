package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// pluginPrefix is the kubelet's unique-name prefix for CSI volumes.
const pluginPrefix = "kubernetes.io/csi/"

// Name identifies a volume on the node, as the kubelet's UniqueVolumeName
// does: one Name per (driver, handle) for volumes from PVs, so two PVs with
// the same handle share it; one Name per (pod, volume) for CSI inline
// volumes, which are never shared.
type Name string

// PersistentName is the Name of a volume from a CSI PersistentVolume:
// "kubernetes.io/csi/<driver>^<handle>".
func PersistentName(driver, handle string) Name {
	return Name(pluginPrefix + driver + "^" + handle)
}

// InlineName is the Name of a CSI inline (ephemeral) volume of a pod:
// "kubernetes.io/csi/<podUID>-<specName>".
func InlineName(pod types.UID, specName string) Name {
	return Name(pluginPrefix + string(pod) + "-" + specName)
}

// InlineHandle is the volume_id the kubelet sends for a CSI inline volume:
// "csi-" + hex(sha256(podUID + specName)).
func InlineHandle(pod types.UID, specName string) string {
	sum := sha256.Sum256([]byte(string(pod) + specName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// AttachmentName is the name of the VolumeAttachment the attach/detach
// controller creates for (handle, driver, node):
// "csi-" + hex(sha256(handle + driver + node)), no separators.
func AttachmentName(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

// String returns the name as text.
func (n Name) String() string { return string(n) }

// IsInline says whether n names a CSI inline volume.
func (n Name) IsInline() bool {
	return strings.HasPrefix(string(n), pluginPrefix) && !strings.Contains(string(n), "^")
}

// Driver returns the driver of a persistent volume's name (the part
// between the plugin prefix and the first "^"; CSI driver names hold no
// "^"), and "" for an inline volume's or a malformed name.
func (n Name) Driver() string {
	rest, ok := strings.CutPrefix(string(n), pluginPrefix)
	if !ok {
		return ""
	}
	driver, _, ok := strings.Cut(rest, "^")
	if !ok {
		return ""
	}
	return driver
}

// PodKey identifies one pod's use of one volume: the unit of publish and
// unpublish.
type PodKey struct {
	Volume Name
	Pod    types.UID
}

// String renders the key for logs.
func (k PodKey) String() string { return string(k.Volume) + "@" + string(k.Pod) }
