package sanity_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// childEnv is set, to the test's name, in the process that runs one test's suite.
const childEnv = "CSI_SANITY_CHILD"

// summary is what Ginkgo's summary line of one csi-sanity run says.
type summary struct {
	Passed, Failed, Pending, Skipped int
}

func (s summary) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d pending, %d skipped", s.Passed, s.Failed, s.Pending, s.Skipped)
}

// summaryLine is Ginkgo's summary of a suite, e.g. "SUCCESS! -- 61 Passed | 0 Failed | 0 Pending | 35 Skipped".
var summaryLine = regexp.MustCompile(`(?m)^(?:SUCCESS|FAIL)! -- (\d+) Passed \| (\d+) Failed \| (\d+) Pending \| (\d+) Skipped`)

// sanityProcess lets the calling test run csi-sanity, which is a Ginkgo suite, and Ginkgo runs one
// suite per process. In the test binary go test started, it re-runs just this test in a fresh copy
// of the binary (sharing the already built plugin binary and passing -ginkgo.* flags on), streams
// that copy's output, fails t if the copy failed, and returns the counts of the copy's csi-sanity
// run, parsed from Ginkgo's summary line (failing t when there is none), and false: the caller
// then returns. In the copy it returns true, and the caller goes on to start its endpoint and call
// runSanity.
func sanityProcess(t *testing.T) (summary, bool) {
	t.Helper()
	if os.Getenv(childEnv) == t.Name() {
		return summary{}, true
	}
	bin, err := plugintest.Binary()
	if err != nil {
		t.Fatalf("build test plugin: %v", err)
	}
	// -test.run matches each level of a subtest's name on its own.
	var run []string
	for _, level := range strings.Split(t.Name(), "/") {
		run = append(run, "^"+regexp.QuoteMeta(level)+"$")
	}
	args := []string{"-test.run=" + strings.Join(run, "/"), "-test.count=1", "-ginkgo.no-color"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-ginkgo.") || strings.HasPrefix(a, "--ginkgo.") {
			args = append(args, a)
		}
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), plugintest.EnvBinary+"="+bin)
	cmd.Stdout, cmd.Stderr = io.MultiWriter(os.Stdout, &out), os.Stderr
	runErr := cmd.Run()
	m := summaryLine.FindSubmatch(out.Bytes())
	if m == nil {
		t.Fatalf("csi-sanity for %s printed no summary (exit: %v); its output is above", t.Name(), runErr)
	}
	var s summary
	for i, p := range []*int{&s.Passed, &s.Failed, &s.Pending, &s.Skipped} {
		*p, _ = strconv.Atoi(string(m[i+1]))
	}
	fmt.Printf("csi-sanity counts %s: %s\n", t.Name(), s)
	if runErr != nil {
		t.Errorf("csi-sanity for %s failed: %v (its output is above)", t.Name(), runErr)
	}
	return s, false
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
		t.Fatal("runSanity needs a process of its own: begin the test with sanityProcess(t)")
	}
	cfg := sanity.NewTestConfig()
	cfg.Address = tgt.Address
	cfg.TestVolumeAccessType = tgt.AccessType
	cfg.StagingPath = filepath.Join(tgt.Dir, "staging")
	cfg.TargetPath = filepath.Join(tgt.Dir, "target")
	cfg.TestNodeVolumeAttachLimit = tgt.TestNodeVolumeAttachLimit
	sanity.Test(t, cfg)
}
