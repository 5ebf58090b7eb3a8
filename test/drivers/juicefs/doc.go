// Package juicefs runs the JuiceFS CSI driver (github.com/juicedata/juicefs-csi-driver) beside
// csi-volmgr, as `make drivers` does (issue 34): its node plugin in "by-process" mode
// (--by-process=true), in which the plugin runs `juicefs mount` itself, so that the FUSE daemon of
// every volume lives in the node plugin's process tree and dies with it (kubernetes/kubernetes#96361).
//
// The node plugin runs as it does in its DaemonSet's container, with the juicefs client at the
// paths its image has (/usr/local/bin/juicefs, /bin/mount.juicefs): in a mount and PID namespace
// of its own (container.go), which shares with the host only the directory below which the agent
// has it mount, as the container's Bidirectional hostPath does; killing it kills every juicefs
// process it started, as a container's restart does. The file system is fully local: metadata in
// SQLite, data in a directory (`--storage file`), formatted by the node plugin itself from the
// Secret.
//
// TestJuiceFS runs `csi-volmgr check` against the node plugin (the driver-restart scenario with
// --driver-command) and the agent's lifecycle on a real kube-apiserver (the agent as its Node,
// under the Node authorizer and NodeRestriction): a static PV whose nodePublishSecretRef the agent
// reads as its Node, a pod on the agent's Node, VolumesReady, data written through the pod's path
// and read through a separate `juicefs mount`, the node plugin killed and restarted while
// published and the pod's mount repaired, the pod deleted and nothing left mounted. It fills the
// driver's record (test/drivers/driverresult), written to $DRIVERS_RESULTS/juicefs.json.
//
// The tests carry the build tag drivers; `make drivers DRIVERS=juicefs` builds the binaries
// (bin/drivers/juicefs) and runs them as root.
package juicefs
