package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// checkPlugin returns the check's arguments for the test plugin with every
// capability and FUSE volumes, run by the check from --driver-command,
// with the bugs given switched on.
func checkPlugin(t *testing.T, bugs ...plugin.Bug) []string {
	t.Helper()
	return checkPluginWith(t, plugin.FaultConfig{Bugs: bugs})
}

// checkPluginWith is checkPlugin with the plugin's whole control file.
func checkPluginWith(t *testing.T, control plugin.FaultConfig) []string {
	t.Helper()
	bin, err := plugintest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "ckc")
	if err != nil {
		t.Fatal(err)
	}
	state, controlFile, endpoint := filepath.Join(dir, "state"), filepath.Join(dir, "control.json"), filepath.Join(dir, "csi.sock")
	t.Cleanup(func() {
		if err := plugin.CleanupMounts(state); err != nil {
			t.Errorf("cleaning up the plugin's mounts: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	if err := plugin.WriteFaultConfig(controlFile, control); err != nil {
		t.Fatal(err)
	}
	command := strings.Join([]string{"exec", bin, "--endpoint=" + endpoint, "--node-id=node-1", "--state-dir=" + state,
		"--control-file=" + controlFile, "--node-expand-volume", "--node-get-volume-stats", "--node-volume-mount-group",
		"--single-node-multi-writer", "--controller-publish-unpublish"}, " ")
	return []string{"check", "--endpoint", "unix://" + endpoint, "--driver-command", command,
		"--params", plugin.FuseParameter + "=true", "--timeout", "30s"}
}

func checkBinary(t *testing.T) string {
	t.Helper()
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// assertScratchClean checks that the check left nothing in its scratch
// directory: no directory, no mount, no loop device over its files.
func assertScratchClean(t *testing.T, scratch string) {
	t.Helper()
	entries, err := os.ReadDir(scratch)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in the scratch directory: %s", e.Name())
	}
	mounts, err := agenttest.MountsBelow(scratch)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		t.Errorf("left mounted: %s", m)
	}
	if out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "BACK-FILE").Output(); err == nil &&
		strings.Contains(string(out), scratch) {
		t.Errorf("loop devices left over the scratch directory's files:\n%s", out)
	}
}

// TestCheckCommand: `csi-volmgr check` passes against the test plugin,
// writes a JUnit file that parses and a JSON report, and exits 0; with a
// driver bug it exits 1 and says what the kubelet expects.
func TestCheckCommand(t *testing.T) {
	bin := checkBinary(t)
	scratch := t.TempDir()
	junit := filepath.Join(t.TempDir(), "junit.xml")
	args := append(checkPlugin(t), "--scratch-dir", scratch, "--junit", junit, "-o", "json")
	cmd := exec.CommandContext(t.Context(), bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("csi-volmgr check: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var report struct {
		Results []struct {
			Name, Status string
			Calls        []struct{ Method string }
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatalf("the JSON report does not parse: %v\n%s", err, stdout.String())
	}
	if len(report.Results) != 13 {
		t.Errorf("%d scenarios in the report, want 13", len(report.Results))
	}
	for _, r := range report.Results {
		if r.Status != "pass" || len(r.Calls) == 0 {
			t.Errorf("scenario %s: %s with %d calls", r.Name, r.Status, len(r.Calls))
		}
	}
	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Tests int `xml:"tests,attr"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil || len(doc.Suites) != 1 || doc.Suites[0].Tests != 13 {
		t.Errorf("JUnit file: %+v, %v", doc, err)
	}
	assertScratchClean(t, scratch)

	t.Run("bug", func(t *testing.T) {
		scratch := t.TempDir()
		args := append(checkPlugin(t, plugin.BugIgnoreReadOnly), "--scratch-dir", scratch, "--scenario", "^readonly")
		out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("csi-volmgr check with a bug: %v, want exit code 1\n%s", err, out)
		}
		for _, want := range []string{"readonly-readwrite  fail", "EROFS", "the write succeeded", "1 of 1 scenarios failed"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		assertScratchClean(t, scratch)
	})
}

// TestCheckCommandKeepsTheSecretsFileSecret: the Secret of --secrets-file
// reaches the driver (which refuses a stage or publish without it), and
// its values appear nowhere the check writes: not in the verbose log (the
// crash scenarios' own processes included), the table, the JSON report or
// the JUnit file.
func TestCheckCommandKeepsTheSecretsFileSecret(t *testing.T) {
	bin := checkBinary(t)
	const value = "s3cr3t-value-7f1c2a"
	secrets := filepath.Join(t.TempDir(), "secret.yaml")
	if err := os.WriteFile(secrets, []byte("password: "+value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := append(checkPluginWith(t, plugin.FaultConfig{RequireNodeSecrets: []string{"password"}}),
		"--secrets-file", secrets, "--scenario", "^(publish-parallel|expand-published|crash-after-stage)$", "--verbose=5")
	for _, format := range []string{"table", "json"} {
		t.Run(format, func(t *testing.T) {
			scratch, junit := t.TempDir(), filepath.Join(t.TempDir(), "junit.xml")
			cmd := exec.CommandContext(t.Context(), bin, append(base, "--scratch-dir", scratch, "--junit", junit, "-o", format)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("csi-volmgr check: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			}
			junitData, err := os.ReadFile(junit)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stderr.String(), `method="/csi.v1.Node/NodeStageVolume" request=`) {
				t.Errorf("the verbose log does not show the stage's request it must keep the secret out of:\n%s", stderr.String())
			}
			// crash-after-stage stages in a volume manager process of its own.
			if !strings.Contains(stderr.String(), `"Staged volume" logger="csi-volmgr-check-step"`) {
				t.Errorf("the verbose log does not show the crash scenario's own process:\n%s", stderr.String())
			}
			for what, out := range map[string]string{"stdout": stdout.String(), "the verbose log": stderr.String(), "the JUnit file": string(junitData)} {
				if strings.Contains(out, value) {
					t.Errorf("the secret's value is in %s:\n%s", what, out)
				}
			}
			assertScratchClean(t, scratch)
		})
	}
}

// TestCheckCommandCleansUpAfterSIGINT: Ctrl-C in the middle of a scenario
// (the volume staged by a killed volume manager) still tears everything
// down and removes the scratch root; the exit code says it was
// interrupted.
func TestCheckCommandCleansUpAfterSIGINT(t *testing.T) {
	bin := checkBinary(t)
	scratch := t.TempDir()
	args := append(checkPlugin(t), "--scratch-dir", scratch, "--scenario", "^(uncertain-stage|crash-after-stage)$")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "uncertain-stage") {
			break
		}
	}
	// crash-after-stage runs: its volume manager process stages the volume
	// and is killed, and the check waits for the restart. Interrupt it once
	// something is mounted in the scratch root.
	var mounts []string
	for deadline := time.Now().Add(10 * time.Second); len(mounts) == 0 && time.Now().Before(deadline); {
		if mounts, err = agenttest.MountsBelow(scratch); err != nil {
			t.Fatal(err)
		}
		if len(mounts) == 0 {
			time.Sleep(10 * time.Millisecond) // polling the mount table
		}
	}
	if len(mounts) == 0 {
		t.Error("nothing mounted in the scratch root when SIGINT was sent: the test interrupts nothing")
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Errorf("csi-volmgr check interrupted: %v, want a non-zero exit code\n%s", err, stdout.String())
	}
	if !strings.Contains(stdout.String(), "crash-after-stage") {
		t.Errorf("the report does not show the interrupted scenario:\n%s", stdout.String())
	}
	assertScratchClean(t, scratch)
}
