//go:build drivers

package secretsstore_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
)

// checkVolumeContext is the volumeAttributes of the check's inline volumes (--ephemeral: the
// driver serves only those). providerName=mock_provider is the driver's own test mode for
// csi-sanity (nodeserver.go: a tmpfs mount and no provider call): the check's pods are not in the
// API server, so the real path, which reads the pod and its SecretProviderClass, is the
// lifecycle's part.
const checkVolumeContext = "providerName=mock_provider"

// runCheck runs `csi-volmgr check --ephemeral` against the node plugin, which the check starts
// itself with --driver-command, and records each scenario.
func runCheck(t *testing.T, rec *drivertest.Recorder, m *matrix) {
	t.Helper()
	dir := filepath.Join(m.dir, "check")
	providers := filepath.Join(dir, "providers")
	for _, d := range []string{providers, filepath.Join(dir, "sock")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// The check's driver listens on a socket of its own: the plugin's endpoint flag is all the
	// check needs, the mounts go below the check's own scratch root. The chart's default flags
	// (enableSecretRotation false): with rotation, the driver's test mode answers a publish
	// without mounting anything.
	sock := filepath.Join(dir, "sock", "csi.sock")
	flags := pluginFlags("", "check-node", providers, filepath.Join(dir, "providers-extra"), "127.0.0.1:"+drivertest.FreePort(t), false)
	flags[1] = "--endpoint=unix://" + sock
	command := drivertest.DriverCommand(drivertest.Binary(t, binDir, "secrets-store-csi-driver"), flags, m.pluginEnv(), filepath.Join(dir, "driver.log"))
	drivertest.RunCheck(t, rec, "--endpoint=unix://"+sock, "--driver-command="+command,
		"--ephemeral", "--volume-context="+checkVolumeContext, "--scratch-dir="+dir)
}
