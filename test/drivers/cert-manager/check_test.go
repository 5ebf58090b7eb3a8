//go:build drivers

package certmanager_test

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
)

// checkNamespace is the namespace of the check's pods: the driver creates their
// CertificateRequests there, and the test's signer signs them.
const checkNamespace = "csi-volmgr-check"

// checkVolumeContext is the volumeAttributes of the check's inline volumes.
const checkVolumeContext = "csi.cert-manager.io/issuer-name=matrix-ca,csi.cert-manager.io/common-name=check.example,csi.cert-manager.io/dns-names=check.example"

// runCheck runs `csi-volmgr check --ephemeral --read-only` against the node plugin, which the
// check starts itself with --driver-command, and records each scenario. The check's pods are not
// in the API server and it mints no token, so its driver runs with the chart's default
// useTokenRequest=false: the driver creates the requests with its own ServiceAccount.
func runCheck(t *testing.T, rec *drivertest.Recorder, m *matrix) {
	t.Helper()
	dir := filepath.Join(m.dir, "check")
	if err := os.MkdirAll(filepath.Join(dir, "sock"), 0o750); err != nil {
		t.Fatal(err)
	}
	dataRoot := filepath.Join(dir, "csi-data-dir")
	t.Cleanup(func() { _ = mount.CleanupMountPoint(filepath.Join(dataRoot, "inmemfs"), mount.New(""), false) })
	sock := filepath.Join(dir, "sock", "csi.sock")
	flags := pluginFlags("", "check-node", dataRootFlag(dataRoot), false)
	flags[3] = "--endpoint=unix://" + sock
	command := "cd / && " + drivertest.DriverCommand(drivertest.Binary(t, binDir, "cert-manager-csi-driver"), flags, m.pluginEnv(), filepath.Join(dir, "driver.log"))
	drivertest.RunCheck(t, rec, "--endpoint=unix://"+sock, "--driver-command="+command,
		"--ephemeral", "--read-only", "--volume-context="+checkVolumeContext, "--scratch-dir="+dir)
}
