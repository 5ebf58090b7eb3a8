package front_test

import (
	"io/fs"
	"os"
	"syscall"
	"testing"
)

// TestEndpointIsOwnerOnly checks the front endpoint's socket: mode 0600,
// owned by the agent's user (root on a node), as the kubelet's plugin
// sockets: anyone who may connect may stage and publish volumes.
func TestEndpointIsOwnerOnly(t *testing.T) {
	regDir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(regDir) })
	stack := startStack(t, "owner-only.csi.example.com", regDir)
	fi, err := os.Lstat(stack.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 || int(st.Uid) != os.Geteuid() {
		t.Errorf("front endpoint %s: mode %v, owner %d; want a socket of mode 0600 owned by %d", stack.Endpoint, fi.Mode(), st.Uid, os.Geteuid())
	}
}
