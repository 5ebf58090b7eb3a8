package paths

import (
	"k8s.io/apimachinery/pkg/types"
)

// subPathsDir is the kubelet's containerSubPathDirectoryName.
const subPathsDir = "volume-subpaths"

// SubPaths returns <root>/pods/<podUID>/volume-subpaths/<escaped name>:
// where a container runtime bind-mounts the subPath volumeMounts of the
// pod's volume, one directory per container holding one mount per
// volumeMount index (the kubelet's subpath layout, keyed like it by the
// volume's spec name: the PV name, or the pod's volume name for inline
// volumes, i.e. volume.PodVolume.PublishName). They must be unmounted
// before the volume is unpublished.
func (l Layout) SubPaths(pod types.UID, publishName string) (string, error) {
	uid := string(pod)
	if err := checkComponent("pod UID", uid); err != nil {
		return "", err
	}
	name, err := escapeName("volume name", publishName)
	if err != nil {
		return "", err
	}
	return l.build(podsDir, uid, subPathsDir, name)
}
