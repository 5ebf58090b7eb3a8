//go:build drivers

package juicefs_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// runCheck runs `csi-volmgr check` (the built binary, as a user runs it) against the node plugin,
// which the check starts, kills and restarts itself (--driver-command), and records every
// scenario in r.Checks. It returns the command line, with the secrets file's path only.
func runCheck(t *testing.T, r *driverresult.Result, bins string, fs *filesystem) {
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := k8stest.KeptDir(t, "jc")
	scratch := filepath.Join(dir, "scratch")
	p := newNodePlugin(t, bins, dir, scratch, filepath.Join(dir, "csi.sock"), "check-node", drivertest.FreePort(t))
	secrets := filepath.Join(dir, "secrets.yaml")
	if err := fs.writeSecretsFile(secrets); err != nil {
		t.Fatal(err)
	}
	args := []string{"check", "--endpoint=unix://" + p.Endpoint, "--driver-command=" + p.Command,
		"--secrets-file=" + secrets, "--scratch-dir=" + scratch, "--timeout=60s", "-o", "json"}
	cmd := exec.CommandContext(t.Context(), bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("csi-volmgr %s\n(%s, exit: %v)\nstderr:\n%s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), runErr, stderr.String())
	var report check.Report
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		r.Checks = append(r.Checks, driverresult.Step{Name: "csi-volmgr check", Result: driverresult.Fail,
			Reason: fmt.Sprintf("no report (exit %v): %s", runErr, lastLine(stderr.String())), Seconds: time.Since(start).Seconds()})
		t.Errorf("csi-volmgr check gave no report: %v\n%s", err, stdout.String())
		return
	}
	for _, res := range report.Results {
		s := drivertest.CheckStep(t, res)
		if len(res.Cleanup) > 0 {
			t.Errorf("check scenario %s left: %v", res.Name, res.Cleanup)
		}
		r.Checks = append(r.Checks, s)
	}
	r.Notes = append(r.Notes, formatRaceNote(report))
	if len(report.Cleanup) > 0 {
		t.Errorf("the check's final cleanup found: %v", report.Cleanup)
		r.Notes = append(r.Notes, "csi-volmgr check's final cleanup found: "+strings.Join(report.Cleanup, "; "))
	}
	if t.Failed() {
		if b, err := os.ReadFile(filepath.Join(dir, "node-plugin.log")); err == nil {
			t.Logf("driver log:\n%s", tail(string(b), 16<<10))
		}
	}
	if report.Version == "" {
		report.Version = "vendor version not reported"
	}
	r.Notes = append(r.Notes, fmt.Sprintf("`csi-volmgr check` ran against the node plugin (%s; node capabilities %s; controller capabilities %s) "+
		"with `--driver-command` (the plugin's container, killed with SIGKILL and restarted in driver-restart) and `--secrets-file` "+
		"(name, metaurl, storage, bucket: the plugin formats the file system itself); the volumes are made by the plugin's own CreateVolume.",
		report.Version, strings.Join(report.NodeCapabilities, ", "), strings.Join(report.ControllerCapabilities, ", ")))
}

// formatRaceNote says how the publishes of one volume run with this driver, and whether this run
// met the format race that parallel publishes cause.
func formatRaceNote(report check.Report) string {
	const race = "Publishes of one volume: the plugin has no STAGE_UNSTAGE_VOLUME and no lock per volume; every " +
		"NodePublishVolume runs `juicefs format` and then `juicefs mount` at /var/lib/jfs/<volume>, relying on the kubelet's one " +
		"mount step of a CSI volume at a time. csi-volmgr runs the publishes and unpublishes of such a driver's volume one at a " +
		"time too (since c7f7e24; before, in parallel: a format of a fresh file system failed with Internal, `Storage " +
		"file:///... is not empty`, and two mounts ended up stacked there, one left behind with its juicefs process)"
	for _, res := range report.Results {
		if res.Name == "publish-parallel" && res.Status == check.Fail && strings.Contains(res.Got, "format error") {
			return race + " — yet this run met the format race in publish-parallel: a regression."
		}
	}
	return race + "."
}
