//go:build drivers

package topolvm_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
)

// runCheck runs `csi-volmgr check` against topolvm-node, which the check starts itself with
// --driver-command, with topolvm-controller as its controller: the check's volumes are
// LogicalVolumes that topolvm-node creates in the test's volume group.
func runCheck(t *testing.T, rec *drivertest.Recorder, m *matrix) {
	t.Helper()
	dir := filepath.Join(m.dir, "check")
	if err := os.MkdirAll(filepath.Join(dir, "sock"), 0o750); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock", "csi-topolvm.sock")
	command := drivertest.DriverCommand(drivertest.Binary(t, binDir, "hypertopolvm"), nodeFlags(sock, m.lvmdConfig),
		m.nodeEnv(), filepath.Join(dir, "topolvm-node.log"))
	drivertest.RunCheck(t, rec, "--endpoint=unix://"+sock, "--controller-endpoint=unix://"+m.controllerSocket(),
		"--driver-command="+command, "--scratch-dir="+dir)
}
