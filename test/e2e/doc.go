// Package e2e holds the end-to-end tests of the volume lifecycle: the agent
// (the volume manager of package volumemanager, as the csi-volmgr command
// runs it) runs in the test process against a real kube-apiserver, and the
// real CSI test plugin registers through its plugin-registration socket and
// makes real bind mounts. The tests assert what a user checks: pod
// conditions, mounts and their data, the plugin's call journal, Node status.
package e2e
