package sanity_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// childEnv is set, to the test's name, in the process that runs one test's suite.
const childEnv = "CSI_SANITY_CHILD"

// ownProcess lets the calling top-level test run csi-sanity, which is a Ginkgo suite, and Ginkgo
// runs one suite per process. In the test binary go test started, it re-runs just this test in a
// fresh copy of the binary (sharing the already built plugin binary and passing -ginkgo.* flags
// on), streams that copy's output, fails t if the copy failed, and returns false: the caller then
// returns. In the copy it returns true, and the caller goes on to start its endpoint and call runSanity.
func ownProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv(childEnv) == t.Name() {
		return true
	}
	bin, err := plugintest.Binary()
	if err != nil {
		t.Fatalf("build test plugin: %v", err)
	}
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-ginkgo.no-color"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-ginkgo.") || strings.HasPrefix(a, "--ginkgo.") {
			args = append(args, a)
		}
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), plugintest.EnvBinary+"="+bin)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("csi-sanity for %s failed: %v (its output is above)", t.Name(), err)
	}
	return false
}

// target is one CSI endpoint to run csi-sanity against.
type target struct {
	// Address is the endpoint: a unix socket path or a unix:// URL.
	Address string
	// AccessType is "mount" or "block".
	AccessType string
	// Dir is where csi-sanity creates its staging and target directories. Create it before the
	// endpoint starts, so that it is removed only after the endpoint cleaned up its mounts.
	Dir string
	// TestNodeVolumeAttachLimit runs the test that publishes more volumes than NodeGetInfo allows.
	TestNodeVolumeAttachLimit bool
}

// runSanity runs the csi-sanity suite against tgt and fails t for every failed spec. Ginkgo prints
// its summary ("N Passed | N Failed | N Pending | N Skipped") to stdout. It may run once per
// process, so the calling test must begin with ownProcess.
func runSanity(t *testing.T, tgt target) {
	t.Helper()
	if os.Getenv(childEnv) != t.Name() {
		t.Fatal("runSanity needs a process of its own: begin the test with `if !ownProcess(t) { return }`")
	}
	cfg := sanity.NewTestConfig()
	cfg.Address = tgt.Address
	cfg.TestVolumeAccessType = tgt.AccessType
	cfg.StagingPath = filepath.Join(tgt.Dir, "staging")
	cfg.TargetPath = filepath.Join(tgt.Dir, "target")
	cfg.TestNodeVolumeAttachLimit = tgt.TestNodeVolumeAttachLimit
	sanity.Test(t, cfg)
}
