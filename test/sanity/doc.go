// Package sanity runs csi-sanity (github.com/kubernetes-csi/csi-test/v5/pkg/sanity) against real CSI
// endpoints: the csi-volmgr test plugin in mount and block mode, directly and through csi-volmgr's
// front endpoint (front/) fronting the plugin, and compares the counts of the two. Each run
// needs its own process (see sanityProcess) and root, for mounts and loop devices.
package sanity
