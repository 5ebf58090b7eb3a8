// Package source is where the lifecycle's inputs come from: the pods bound
// to this node (an informer filtered by spec.nodeName) and the
// PersistentVolumeClaims, PersistentVolumes, VolumeAttachments and Node
// those pods need, each watched by name only while some pod references it
// (the kubelet's watch-based object manager), so that the API server's cost
// per node grows with the node's own objects and never with the cluster.
// Reads come from these caches; changes are turned into "re-evaluate these
// pods" and "this volume's VolumeAttachment changed" notifications.
package source
