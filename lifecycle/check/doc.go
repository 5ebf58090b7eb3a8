// Package check drives a CSI node plugin through the kubelet's volume
// lifecycle, scenario by scenario, with csi-volmgr's own operations: the
// kubelet's paths (lifecycle/paths), the durable records
// (lifecycle/checkpoint), the uncertain states, the reconstruction after a
// crash (lifecycle/reconstruct) and the mount repair after a driver restart
// (lifecycle/mountcheck). It is `csi-volmgr check`, the test a driver author
// runs against a node plugin without a cluster: csi-sanity checks single
// calls, this checks the sequences the kubelet makes across processes and
// time.
//
// Everything happens in a scratch root that Run removes afterwards, also
// after a failure or a cancelled context: every volume is unpublished,
// unstaged, detached and deleted, and what a driver leaves mounted under the
// root is unmounted and reported.
package check
