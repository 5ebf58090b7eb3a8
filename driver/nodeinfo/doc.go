// Package nodeinfo publishes a registered CSI driver's node information in the
// API, as the kubelet's nodeinfomanager does: the driver's entry in the node's
// CSINode object, its node ID in the Node annotation
// csi.volume.kubernetes.io/nodeid, and its topology segments as Node labels.
//
// A Manager serves one node. Install runs on driver registration and
// Uninstall on deregistration; every write is a patch guarded by the
// resourceVersion that was read, retried on conflict.
package nodeinfo
