package drivertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

// RunCheck runs `csi-volmgr check` (the built binary, as a driver author runs it) with args and
// -o json, and records each scenario in rec's Checks: a failed one fails the test too.
func RunCheck(t *testing.T, rec *Recorder, args ...string) {
	t.Helper()
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	args = append(append([]string{"check"}, args...), "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	t.Logf("csi-volmgr %s: %v\n%s", strings.Join(args, " "), runErr, stderr.String())
	var report check.Report
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		rec.R.Checks = append(rec.R.Checks, driverresult.Step{Name: "csi-volmgr check", Result: driverresult.Fail,
			Reason: fmt.Sprintf("no report (%v): %s", err, strings.TrimSpace(stderr.String()))})
		t.Errorf("csi-volmgr check: %v; stdout %q", runErr, stdout.String())
		return
	}
	for _, res := range report.Results {
		rec.R.Checks = append(rec.R.Checks, CheckStep(t, res))
	}
	if len(report.Cleanup) > 0 {
		rec.Note("csi-volmgr check's cleanup found: %s", strings.Join(report.Cleanup, "; "))
		t.Errorf("csi-volmgr check's cleanup found: %v", report.Cleanup)
	}
}

// ShellQuote quotes s for /bin/sh (the check's --driver-command).
func ShellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// DriverCommand is a --driver-command that runs bin with flags and env (NAME=value), its output
// appended to log.
func DriverCommand(bin string, flags, env []string, log string) string {
	parts := make([]string, 0, len(env)+len(flags)+2)
	for _, e := range env {
		name, value, _ := strings.Cut(e, "=")
		parts = append(parts, name+"="+ShellQuote(value))
	}
	parts = append(parts, "exec", ShellQuote(bin))
	for _, f := range flags {
		parts = append(parts, ShellQuote(f))
	}
	return strings.Join(parts, " ") + " >>" + ShellQuote(log) + " 2>&1"
}

// CheckStep is the result row of one scenario of a check report; a failed
// scenario fails the test, its calls logged.
func CheckStep(t *testing.T, res check.Result) driverresult.Step {
	t.Helper()
	s := driverresult.Step{Name: res.Name, Seconds: Seconds(res.Duration)}
	switch res.Status {
	case check.Pass:
		s.Result = driverresult.Pass
	case check.Skipped:
		s.Result, s.Reason = driverresult.Skip, res.Reason
	default:
		s.Result = driverresult.Fail
		s.Reason = fmt.Sprintf("%s: expected %s; got %s", res.Reason, res.Expected, res.Got)
		t.Errorf("check scenario %s failed: %s", res.Name, s.Reason)
		for _, c := range res.Calls {
			t.Logf("  %-28s %-20s %8s %s %s", c.Method, c.Code, c.Duration.Round(time.Microsecond), c.Message, c.Note)
		}
	}
	return s
}
