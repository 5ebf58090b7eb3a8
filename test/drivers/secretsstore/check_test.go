//go:build drivers

package secretsstore_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

// runCheck runs `csi-volmgr check` (the built binary, as a driver author runs it) against the
// node plugin, which the check starts itself with --driver-command, and records each scenario.
func runCheck(t *testing.T, rec *recorder, m *matrix) {
	t.Helper()
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(m.dir, "check")
	providers := filepath.Join(dir, "providers")
	for _, d := range []string{providers, filepath.Join(dir, "sock")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// The check's driver listens on a socket of its own: the plugin's endpoint flag is all the
	// check needs, the mounts go below the check's own scratch root.
	sock := filepath.Join(dir, "sock", "csi.sock")
	// The chart's default flags (enableSecretRotation false): with rotation, the driver's test
	// mode answers a publish without mounting anything.
	flags := pluginFlags("", "check-node", providers, filepath.Join(dir, "providers-extra"), "127.0.0.1:"+freePort(t), false)
	flags[1] = "--endpoint=unix://" + sock
	command := fmt.Sprintf("KUBECONFIG=%s exec %s %s >>%s 2>&1", shellQuote(m.driverKubeconfig),
		shellQuote(binary(t, "secrets-store-csi-driver")), strings.Join(quoteAll(flags), " "), shellQuote(filepath.Join(dir, "driver.log")))

	args := []string{"check", "--endpoint=unix://" + sock, "--driver-command=" + command,
		"--ephemeral", "--volume-context=" + checkVolumeContext, "--scratch-dir=" + dir, "-o", "json"}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	t.Logf("csi-volmgr check %s: %v\n%s", strings.Join(args[1:], " "), runErr, stderr.String())
	var report check.Report
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		rec.r.Checks = append(rec.r.Checks, driverresult.Step{Name: "csi-volmgr check", Result: driverresult.Fail,
			Reason: fmt.Sprintf("no report (%v): %s", err, strings.TrimSpace(stderr.String()))})
		t.Errorf("csi-volmgr check: %v; stdout %q", runErr, stdout.String())
		return
	}
	for _, res := range report.Results {
		s := driverresult.Step{Name: res.Name, Seconds: seconds(res.Duration)}
		switch res.Status {
		case check.Pass:
			s.Result = driverresult.Pass
		case check.Skipped:
			s.Result, s.Reason = driverresult.Skip, res.Reason
		default:
			s.Result = driverresult.Fail
			s.Reason = fmt.Sprintf("%s: expected %s; got %s", res.Reason, res.Expected, res.Got)
			t.Errorf("check %s failed: %s", res.Name, s.Reason)
		}
		rec.r.Checks = append(rec.r.Checks, s)
	}
	if len(report.Cleanup) > 0 {
		rec.note("csi-volmgr check's cleanup found: %s", strings.Join(report.Cleanup, "; "))
		t.Errorf("csi-volmgr check's cleanup found: %v", report.Cleanup)
	}
}

// checkVolumeContext is the volumeAttributes of the check's inline volumes (--ephemeral: the
// driver serves only those). providerName=mock_provider is the driver's own test mode for
// csi-sanity (nodeserver.go: a tmpfs mount and no provider call): the check's pods are not in the
// API server, so the real path, which reads the pod and its SecretProviderClass, is the
// lifecycle's part.
const checkVolumeContext = "providerName=mock_provider"

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = shellQuote(s)
	}
	return out
}
