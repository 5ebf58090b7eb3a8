// Package sanity runs csi-sanity (github.com/kubernetes-csi/csi-test/v5/pkg/sanity) against real CSI
// endpoints: the csi-volmgr test plugin in mount and block mode, and any other endpoint a test in
// this package starts. Each run needs its own process (see ownProcess) and root, for mounts and loop devices.
package sanity
