//go:build e2e

package identity_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/test/process"
)

// startProc starts bin with args, logging to <dir>/<name>.log; it is
// stopped (SIGTERM, then SIGKILL) when the test ends, and the end of its log
// is printed if the test failed. (As test/cluster's.)
func startProc(t testing.TB, dir, name, bin string, args ...string) *process.Process {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s: %v (run make e2e-bins)", name, err)
	}
	p := process.New(process.Options{Name: name, Path: bin, Args: args, LogFile: filepath.Join(dir, name+".log"), ProcessGroup: true})
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, name, p)
	return p
}

// closeAtCleanup stops p when t ends and prints the end of its log if t
// failed.
func closeAtCleanup(t testing.TB, name string, p *process.Process) {
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Logf("stopping %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("%s log, last 8 KiB:\n%s", name, p.TailLog(8<<10))
		}
	})
}

// freePort returns a TCP port nobody listens on now.
func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// binDir is where make e2e-bins puts the control plane's binaries.
func binDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..", "bin", "k8s")
}

// repoFile is a file of the repository, by its path from the root.
func repoFile(t testing.TB, rel string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..", rel)
}
