package k8stest

import (
	"maps"
	"os"
	"testing"
)

// KeptDir is a fresh directory for one test's logs and files, with a short
// path (sockets live below it): removed when the test passed, kept and its
// path logged when it failed.
func KeptDir(tb testing.TB, prefix string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

// StartNodeRestricted starts etcd and kube-apiserver as kubeadm and kind
// run it — authorization Node,RBAC, admission NodeRestriction — with a
// client signer for Node certificates (Env.NodeConfig) and the API server
// flags of extra besides, and stops them when the test ends.
func StartNodeRestricted(tb testing.TB, extra map[string][]string) *Env {
	tb.Helper()
	flags := map[string][]string{
		"authorization-mode":       {"Node,RBAC"},
		"enable-admission-plugins": {"NodeRestriction"},
	}
	maps.Copy(flags, extra)
	env, err := Start(Options{NodeClientSigner: true, APIServerFlags: flags})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := env.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return env
}
