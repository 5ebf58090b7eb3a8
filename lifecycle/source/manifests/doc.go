// Package manifests is the standalone mode's source: the pods,
// PersistentVolumeClaims, PersistentVolumes, Secrets and CSIDriver objects
// of a directory of YAML or JSON manifests (*.yaml, *.yml, *.json, several
// documents per file allowed; dot-files and subdirectories are not read),
// watched with fsnotify, so that adding a pod's file mounts its
// volumes and removing it tears them down. It serves the populator exactly
// as lifecycle/source serves it from an API server.
//
// What a control plane would do is done here:
//
//   - namespaced objects without a namespace are in "default"; objects
//     without metadata.uid get a UID derived from kind, namespace and name,
//     stable across edits and restarts (a pod's UID names its directory);
//   - pods without spec.nodeName are this node's; pods that name another
//     node are ignored;
//   - a claim and a volume that name each other (the claim's
//     spec.volumeName, or the volume's spec.claimRef) are bound: the claim
//     is Bound to the volume and the volume's claimRef carries the claim's
//     UID, as the PV controller binds pre-bound pairs; a claim that binds
//     to nothing is Pending;
//   - a Secret's stringData is merged into its data.
//
// An object defined in two files is taken from the file whose name sorts
// first. A file is taken whole or not at all: at start-up (New) a file that
// does not parse is an error naming the file and line; later it is logged
// on one line and what the file described before stays, so a half-written
// file never tears anything down and other files are never affected.
package manifests
