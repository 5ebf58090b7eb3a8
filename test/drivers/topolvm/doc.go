// Package topolvm runs TopoLVM's stock binaries (github.com/topolvm/topolvm, hypertopolvm: the
// topolvm-node CSI node plugin with its embedded lvmd, and topolvm-controller, the CSI controller)
// beside csi-volmgr, for the driver matrix of `make drivers` (docs/drivers.md): the matrix's
// driver of filesystem and raw block volumes.
//
// The test (build tag drivers, root) makes a volume group of its own on a loop device backed by a
// sparse file, starts etcd and kube-apiserver with TopoLVM's LogicalVolume CRD, runs the
// controller and `csi-volmgr check` against the node plugin (which the check starts and restarts
// with --driver-command), and records every scenario in a driverresult.Result, written to
// $DRIVERS_RESULTS/topolvm.json when that variable is set.
package topolvm
