//go:build drivers

package juicefs_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	driverName = "csi.juicefs.com"
	module     = "github.com/juicedata/juicefs-csi-driver"
	version    = "v0.30.1"
	// clientVersion is the juicefs client built beside it (test/drivers/juicefs/tools/client).
	clientVersion = "v1.3.1"
)

// TestJuiceFS is the JuiceFS row of the driver matrix: csi-volmgr check against the node plugin,
// then the agent's lifecycle with it on a real control plane. Its record is written to
// $DRIVERS_RESULTS/juicefs.json whatever happens.
func TestJuiceFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("make drivers runs as root: the node plugin mounts")
	}
	bins := binDir(t)
	start := time.Now()
	commit, err := driverresult.Commit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r := &driverresult.Result{
		Name:    "juicefs",
		Driver:  driverName,
		Kind:    "fuse (by-process: juicefs mount in the node plugin's process tree)",
		Module:  module,
		Version: version,
		Commit:  commit,
		Machine: driverresult.Machine(),
		Settings: []string{
			"`mountMode: process` (the node plugin's `--by-process=true`): the default mount-pod mode needs a kubelet on the node to run the mount pods; csi-volmgr runs no pods",
			"`kubeletDir: /var/lib/csi-volmgr` (csi-volmgr's `--root-dir`): the node plugin's Bidirectional hostPath, mounted at the same path in its container",
			"node-driver-registrar's `--kubelet-registration-path=/var/lib/csi-volmgr/csi-plugins/csi.juicefs.com/csi.sock` and its registration directory `/var/lib/csi-volmgr/plugins_registry` (the chart derives both from kubeletDir)",
			"the node plugin's environment: `POD_NAME` containing `csi-node` (the plugin picks its role from its pod's name, as the chart's DaemonSet names it), `JUICEFS_CSI_WEB_PORT` to move its metrics off 8080 if taken; `node.enableManager`, `KUBELET_PORT` and `HOST_IP` are unused in process mode (no pod manager, no kubelet to poll)",
			"the juicefs client at `/usr/local/bin/juicefs` and `/bin/mount.juicefs` in the node plugin's container (the driver's image has it there; the paths are hard-coded)",
			"the CSIDriver `csi.juicefs.com` as the chart installs it (attachRequired: false, podInfoOnMount: false): csi-volmgr reads it as a kubelet does",
		},
		Notes: []string{
			fmt.Sprintf("juicefs client %s (github.com/juicedata/juicefs, the release nearest after the CSI driver's that the module proxy serves), at the image's paths /usr/local/bin/juicefs and /bin/mount.juicefs, which the driver hard-codes; metadata in SQLite, data in a directory (`storage: file`).", clientVersion),
			"No node-driver-registrar (its module is not served here): the test serves the plugin-registration socket itself, as node-driver-registrar does, from a process that keeps running while the node plugin restarts (test/plugin's registration server).",
		},
	}
	t.Cleanup(func() {
		r.Seconds = time.Since(start).Seconds()
		r.Date = time.Now().UTC().Format(time.RFC3339)
		dir := os.Getenv("DRIVERS_RESULTS")
		if dir == "" {
			t.Log("DRIVERS_RESULTS not set: the result is not written")
			return
		}
		if err := driverresult.Write(dir, *r); err != nil {
			t.Errorf("writing the result: %v", err)
			return
		}
		t.Logf("driver result written to %s", filepath.Join(dir, r.Name+".json"))
	})
	// The steps record what they see; a failed step fails the test (t.Errorf) and the next
	// steps still run where they can.
	t.Run("check", func(t *testing.T) {
		runCheck(t, r, bins, newFilesystem(t, "jfscheck"))
	})
	t.Run("lifecycle", func(t *testing.T) {
		runLifecycle(t, r, bins, newFilesystem(t, "jfslife"))
	})
}

// filesystem is a local JuiceFS file system: metadata in SQLite, data in a directory. The node
// plugin formats it from the Secret at the first mount.
type filesystem struct {
	Name, MetaURL, Storage, Bucket string
}

func newFilesystem(t *testing.T, name string) *filesystem {
	dir := k8stest.KeptDir(t, "jd")
	if err := os.MkdirAll(filepath.Join(dir, "bucket"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &filesystem{Name: name, MetaURL: "sqlite3://" + filepath.Join(dir, "meta.db"), Storage: "file", Bucket: filepath.Join(dir, "bucket") + "/"}
}

// secrets are the Secret's keys the JuiceFS node plugin reads (community edition).
func (f *filesystem) secrets() map[string]string {
	return map[string]string{"name": f.Name, "metaurl": f.MetaURL, "storage": f.Storage, "bucket": f.Bucket}
}

// writeSecretsFile writes the secrets as `csi-volmgr check --secrets-file` reads them (JSON is YAML).
func (f *filesystem) writeSecretsFile(path string) error {
	b, err := json.Marshal(f.secrets())
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// binDir is where make drivers-bins-juicefs puts the binaries.
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("DRIVERS_BIN")
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(wd, "..", "..", "..", "bin", "drivers")
	}
	dir = filepath.Join(dir, "juicefs")
	for _, b := range []string{"juicefs-csi-driver", "juicefs"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%v: run make drivers-bins-juicefs", err)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

func runCmd(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// step runs f and records it as a step: pass, or fail with f's error as the reason (and t.Errorf).
func step(t *testing.T, steps *[]driverresult.Step, name string, f func() error) bool {
	t.Helper()
	start := time.Now()
	err := f()
	s := driverresult.Step{Name: name, Result: driverresult.Pass, Seconds: time.Since(start).Seconds()}
	var skip skipError
	switch {
	case errors.As(err, &skip):
		s.Result, s.Reason = driverresult.Skip, skip.reason
	case err != nil:
		s.Result, s.Reason = driverresult.Fail, err.Error()
		t.Errorf("%s: %v", name, err)
	}
	*steps = append(*steps, s)
	return err == nil
}

// skipError makes step record a skip with its reason.
type skipError struct{ reason string }

func (e skipError) Error() string { return "skipped: " + e.reason }
