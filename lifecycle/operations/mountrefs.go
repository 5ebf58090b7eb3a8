package operations

import (
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/mount-utils"
)

// mountInfoPath is the mount table whose propagation fields tell a
// propagation copy of a mount from a mount of its own.
const mountInfoPath = "/proc/self/mountinfo"

// deviceMountRefs returns the mounts that still use what is mounted at the
// staging path path: the kubelet's GetDeviceMountRefs (every other mount
// point of the same file system root), less the propagation copies of
// path's own mount. An agent that sees the host's root through a
// HostToContainer mount (a runtime's /host, for instance) sees each
// staging mount a second time there, as a slave of the staging mount's
// peer group; that copy is unmounted with the staging mount (an unmount
// propagates from master to slaves), so it is nobody's use of the volume.
// Counted, it kept every such volume staged for ever. A pod's publish
// mount (a bind of the staging path) is a mount of its own, or a peer of
// it: it still counts.
func (o *Operations) deviceMountRefs(path string) ([]string, error) {
	refs, err := o.mounts.GetMountRefs(path)
	if err != nil || len(refs) == 0 {
		return refs, err
	}
	infos, err := mount.ParseMountInfo(mountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", mountInfoPath, err)
	}
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		path = resolved // GetMountRefs looks the path up resolved
	}
	return withoutPropagationCopies(path, refs, infos), nil
}

// withoutPropagationCopies returns refs less the mount points that infos
// (a mount table) shows as slaves of the peer group path's mount is shared
// in. A ref it does not find in infos is kept.
func withoutPropagationCopies(path string, refs []string, infos []mount.MountInfo) []string {
	// The last mount at a point is the one on top, the one a path reaches.
	top := make(map[string]mount.MountInfo, len(infos))
	for _, mi := range infos {
		top[mi.MountPoint] = mi
	}
	group := propagationTag(top[path].OptionalFields, "shared:")
	if group == "" {
		return refs
	}
	var kept []string
	for _, ref := range refs {
		if mi, ok := top[ref]; ok && propagationTag(mi.OptionalFields, "master:") == group {
			continue
		}
		kept = append(kept, ref)
	}
	return kept
}

// propagationTag returns the peer group ID of the optional field of a
// mountinfo line with the given prefix ("shared:" or "master:"), or "".
func propagationTag(fields []string, prefix string) string {
	for _, f := range fields {
		if id, ok := strings.CutPrefix(f, prefix); ok {
			return id
		}
	}
	return ""
}
