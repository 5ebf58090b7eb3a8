// Package paths is the kubelet-compatible on-disk layout under the agent's
// root directory: where a volume is staged, where a pod's volume is
// published, and where their vol_data.json records live. Every path is built
// by one function from validated parts, so a name that would escape the root
// is an error wrapping volume.ErrInvalidName, never a path; the scanners turn
// the directories found under the root back into those parts for
// reconstruction after a restart.
//
// # Layout
//
// Filesystem volumes, exactly as the kubelet lays them out:
//
//	<root>/plugins/kubernetes.io/csi/<driver>/<hex sha256(handle)>/vol_data.json   staged record
//	<root>/plugins/kubernetes.io/csi/<driver>/<hex sha256(handle)>/globalmount     staging_target_path
//	<root>/pods/<podUID>/volumes/kubernetes.io~csi/<escaped name>/vol_data.json    publish record
//	<root>/pods/<podUID>/volumes/kubernetes.io~csi/<escaped name>/mount            target_path
//
// Block volumes: the paths a driver sees are the kubelet's (pkg/volume/csi/csi_block.go):
//
//	<root>/plugins/kubernetes.io/csi/volumeDevices/staging/<pvName>                 staging_target_path
//	<root>/plugins/kubernetes.io/csi/volumeDevices/publish/<pvName>/<podUID>        target_path (a file the driver creates)
//
// but the records live where the filesystem ones do, so that one scan finds
// every volume: the staged record in the same <driver>/<hash> directory, the
// publish record in <root>/pods/<podUID>/volumeDevices/kubernetes.io~csi/<escaped
// name>/vol_data.json. That directory is where the kubelet keeps the pod's
// device symlink; csi-volmgr hands no device to a container runtime, so it
// makes no symlinks and no global map (volumeDevices/<pvName>/dev) — the
// published file at the target path is the device.
//
// Volumes a container orchestrator stages and publishes through the front
// endpoint (front/) are mounted at paths the orchestrator chose; only
// their records live under the root, in a tree of their own that the
// kubelet-layout scanners never visit (see CallerVolume):
//
//	<root>/front/<driver>/<hex sha256(handle)>/vol_data.json            staged record
//	<root>/front/<driver>/<hex sha256(handle)>/<podUID>/vol_data.json   publish record
//
// The escaped name is k8s.io/utils/strings.EscapeQualifiedName of the publish
// name ("/" becomes "~"). Names containing "~" are rejected, so escaping is
// reversible and parsing a built path gives back exactly the name it was
// built from; neither "/" nor "~" occurs in a valid Kubernetes volume or PV
// name anyway.
package paths
