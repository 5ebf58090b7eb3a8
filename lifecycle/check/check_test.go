package check_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// envChild makes the test binary a volume manager process of the crash
// scenarios, as `csi-volmgr check-step` is for the command.
const envChild = "CSI_VOLMGR_CHECK_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		os.Exit(check.RunChild(context.Background(), os.Stdin, os.Stdout)) //nolint:forbidigo // TestMain has no t.Context

	}
	os.Exit(m.Run())
}

func childCommand(ctx context.Context) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), envChild+"=1")
	return cmd
}

// testPlugin is the CSI test plugin with every capability, run by the
// check from its command line; its filesystem volumes are FUSE-backed, so
// that a restart breaks their mounts as a FUSE driver's.
type testPlugin struct {
	dir, endpoint, stateDir, control string
	command                          string
}

func newTestPlugin(t *testing.T, bugs ...plugin.Bug) *testPlugin {
	t.Helper()
	bin, err := plugintest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "ck")
	if err != nil {
		t.Fatal(err)
	}
	p := &testPlugin{dir: dir, endpoint: filepath.Join(dir, "csi.sock"), stateDir: filepath.Join(dir, "state"), control: filepath.Join(dir, "control.json")}
	if err := plugin.WriteFaultConfig(p.control, plugin.FaultConfig{Bugs: bugs}); err != nil {
		t.Fatal(err)
	}
	args := []string{bin, "--endpoint=" + p.endpoint, "--node-id=testnode", "--state-dir=" + p.stateDir,
		"--control-file=" + p.control, "--journal=" + filepath.Join(dir, "journal.jsonl"), "--v=4"}
	for _, f := range []string{"node-stage-unstage", "node-expand-volume", "node-get-volume-stats", "node-get-volume-health",
		"node-volume-mount-group", "single-node-multi-writer", "controller-publish-unpublish"} {
		args = append(args, "--"+f+"=true")
	}
	p.command = "exec " + strings.Join(args, " ")
	t.Cleanup(func() {
		if err := plugin.CleanupMounts(p.stateDir); err != nil {
			t.Errorf("cleaning up the plugin's mounts: %v", err)
		}
		if t.Failed() {
			t.Logf("plugin state in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return p
}

func (p *testPlugin) config(t *testing.T, scratch string) check.Config {
	return check.Config{
		Endpoint:      "unix://" + p.endpoint,
		DriverCommand: p.command,
		Params:        map[string]string{plugin.FuseParameter: "true"},
		ScratchDir:    scratch,
		Child:         childCommand,
		Timeout:       30 * time.Second,
	}
}

// assertNothingLeft checks what the check promises: no mount, no loop
// device over its files, no directory left in the scratch directory.
func assertNothingLeft(t *testing.T, scratch string, dirs ...string) {
	t.Helper()
	for _, dir := range append([]string{scratch}, dirs...) {
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mounts {
			t.Errorf("left mounted: %s", m.Mountpoint)
		}
	}
	entries, err := os.ReadDir(scratch)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in the scratch directory: %s", e.Name())
	}
	out, err := exec.Command("losetup", "--list", "--noheadings", "--output", "BACK-FILE").Output()
	if err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), scratch) {
				t.Errorf("loop device left over %s", strings.TrimSpace(line))
			}
		}
	}
}

func statuses(r *check.Report) map[string]check.Status {
	out := map[string]check.Status{}
	for _, res := range r.Results {
		out[res.Name] = res.Status
	}
	return out
}

// TestPassesAgainstTheTestPlugin: every scenario passes against the test
// plugin with every capability, the reports are readable (the JUnit
// document parses), and nothing is left behind.
func TestPassesAgainstTheTestPlugin(t *testing.T) {
	p := newTestPlugin(t)
	scratch := t.TempDir()
	start := time.Now()
	report, err := check.Run(t.Context(), p.config(t, scratch))
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := report.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("whole set in %s:\n%s", time.Since(start).Round(time.Millisecond), table.String())
	for _, res := range report.Results {
		if res.Status != check.Pass {
			t.Errorf("scenario %s: %s (%s): expected %s, got %s", res.Name, res.Status, res.Reason, res.Expected, res.Got)
		}
		for _, c := range res.Cleanup {
			t.Errorf("scenario %s left: %s", res.Name, c)
		}
	}
	if got, want := len(report.Results), len(check.Scenarios()); got != want {
		t.Errorf("%d scenarios ran, want %d", got, want)
	}
	if report.Failed() {
		t.Errorf("report says failed: cleanup %v", report.Cleanup)
	}
	if d := time.Since(start); d > 2*time.Minute {
		t.Errorf("the whole set took %s, more than 2 minutes", d)
	}

	var junit bytes.Buffer
	if err := report.WriteJUnit(&junit); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Skipped *struct{} `xml:"skipped"`
				Out     string    `xml:"system-out"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(junit.Bytes(), &doc); err != nil {
		t.Fatalf("the JUnit document does not parse: %v\n%s", err, junit.String())
	}
	if len(doc.Suites) != 1 || doc.Suites[0].Tests != len(report.Results) || doc.Suites[0].Failures != 0 {
		t.Errorf("JUnit suites = %+v", doc.Suites)
	}
	for _, c := range doc.Suites[0].Cases {
		if !strings.Contains(c.Out, "Node") {
			t.Errorf("JUnit case %s lists no CSI call: %q", c.Name, c.Out)
		}
	}
	var js bytes.Buffer
	if err := report.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back check.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Results) != len(report.Results) {
		t.Errorf("the JSON report does not read back: %v", err)
	}
	// The plugin was stopped with every volume torn down: none of its
	// mounts is left either.
	assertNothingLeft(t, scratch, p.stateDir)
}

// TestEachScenarioCatchesItsBug: with one driver bug switched on in the
// test plugin, the scenario that checks that behaviour fails, and only it
// (and the scenarios named in also, which meet the bug on their way).
func TestEachScenarioCatchesItsBug(t *testing.T) {
	table := []struct {
		bug      plugin.Bug
		scenario string
		also     []string
	}{
		{plugin.BugFailConcurrentPublish, "publish-parallel", nil},
		{plugin.BugPublishStacksMount, "repeat-calls", nil},
		{plugin.BugIgnoreReadOnly, "readonly-readwrite", nil},
		{plugin.BugUnmountedTeardownFails, "teardown-unmounted", nil},
		// The repair of a broken staging path stages the volume again,
		// which such a driver formats.
		{plugin.BugFormatOnStage, "data-survives-republish", []string{"driver-restart"}},
		{plugin.BugBlockPublishWithoutMount, "block-two-pods", nil},
		{plugin.BugIgnoreMountGroup, "volume-mount-group", nil},
		{plugin.BugStatsUsedZero, "volume-stats", nil},
		{plugin.BugExpandNoop, "expand-published", nil},
		{plugin.BugStageInProgressOK, "uncertain-stage", nil},
		{plugin.BugStageUncheckedMount, "crash-after-stage", nil},
		{plugin.BugUnpublishTrustsRecord, "crash-after-unpublish", nil},
		{plugin.BugKeepBrokenMount, "driver-restart", nil},
	}
	covered := map[string]bool{}
	for _, tc := range table {
		covered[tc.scenario] = true
	}
	for _, s := range check.Scenarios() {
		if !covered[s] {
			t.Errorf("scenario %s has no bug in the table", s)
		}
	}
	only := os.Getenv("CHECK_BUG")
	for _, tc := range table {
		if only != "" && string(tc.bug) != only {
			continue
		}
		t.Run(string(tc.bug), func(t *testing.T) {
			t.Parallel()
			p := newTestPlugin(t, tc.bug)
			scratch := t.TempDir()
			report, err := check.Run(t.Context(), p.config(t, scratch))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			_ = report.WriteTable(&out)
			for _, res := range report.Results {
				want := check.Pass
				if res.Name == tc.scenario || slices.Contains(tc.also, res.Name) {
					want = check.Fail
				}
				if res.Status != want {
					t.Errorf("scenario %s: %s (%s: expected %s, got %s), want %s", res.Name, res.Status, res.Reason, res.Expected, res.Got, want)
				}
			}
			if !report.Failed() {
				t.Errorf("the report does not say failed")
			}
			if t.Failed() {
				t.Log(out.String())
			}
			// A buggy driver may leave its own mounts (the test cleanup takes
			// them); the check leaves nothing of its own.
			assertNothingLeft(t, scratch)
		})
	}
}

// TestScenarioSelection: --scenario runs only the matching scenarios.
func TestScenarioSelection(t *testing.T) {
	p := newTestPlugin(t)
	cfg := p.config(t, t.TempDir())
	cfg.DriverCommand = ""
	cmd := exec.Command("/bin/sh", "-c", p.command)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	cfg.Scenario = regexp.MustCompile("^(publish-parallel|driver-restart)$")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(p.endpoint); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	report, err := check.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(statuses(report))
	if want := "map[driver-restart:skipped publish-parallel:pass]"; got != want {
		t.Errorf("statuses = %s, want %s", got, want)
	}
}

// TestSkipsWhatTheDriverDoesNotOffer: against the test plugin with its
// default capabilities (STAGE_UNSTAGE_VOLUME only: no attach, no stats,
// no expansion, no volume_mount_group; bind-mounted volumes) and not run by
// the check, the scenarios that need more are skipped with the reason and
// the others pass.
func TestSkipsWhatTheDriverDoesNotOffer(t *testing.T) {
	scratch := t.TempDir()
	p := plugintest.Start(t, plugintest.Options{})
	report, err := check.Run(t.Context(), check.Config{Endpoint: "unix://" + p.Endpoint, ScratchDir: scratch, Child: childCommand, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	skipped := map[string]string{
		"volume-mount-group": "VOLUME_MOUNT_GROUP",
		"volume-stats":       "GET_VOLUME_STATS",
		"expand-published":   "EXPAND_VOLUME",
		"driver-restart":     "--driver-command",
	}
	for _, res := range report.Results {
		if why, ok := skipped[res.Name]; ok {
			if res.Status != check.Skipped || !strings.Contains(res.Reason, why) {
				t.Errorf("scenario %s: %s (%s), want skipped naming %s", res.Name, res.Status, res.Reason, why)
			}
			continue
		}
		if res.Status != check.Pass {
			t.Errorf("scenario %s: %s (%s: expected %s, got %s)", res.Name, res.Status, res.Reason, res.Expected, res.Got)
		}
	}
	assertNothingLeft(t, scratch)
}

// TestTakesAVolumeHandleWithoutAController: against a node-only plugin (no
// CONTROLLER_SERVICE) the check runs the filesystem scenarios on the
// pre-provisioned volume --volume-handle names, skips what needs a new
// volume (block) with the reason, and leaves the volume it did not create
// where it was.
func TestTakesAVolumeHandleWithoutAController(t *testing.T) {
	scratch := t.TempDir()
	caps := plugin.DefaultCapabilities()
	caps.NodeOnly = true
	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
	conn, err := p.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	created, err := csi.NewControllerClient(conn).CreateVolume(t.Context(), &csi.CreateVolumeRequest{
		Name: "pre-provisioned",
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	handle := created.GetVolume().GetVolumeId()

	report, err := check.Run(t.Context(), check.Config{Endpoint: "unix://" + p.Endpoint, ScratchDir: scratch, Child: childCommand,
		Timeout: 30 * time.Second, VolumeHandle: handle, VolumeContext: created.GetVolume().GetVolumeContext()})
	if err != nil {
		t.Fatal(err)
	}
	passed := 0
	for _, res := range report.Results {
		switch {
		case res.Name == "block-two-pods":
			if res.Status != check.Skipped || !strings.Contains(res.Reason, "CREATE_DELETE_VOLUME") {
				t.Errorf("scenario %s: %s (%s), want skipped for want of a controller", res.Name, res.Status, res.Reason)
			}
		case res.Status == check.Pass:
			passed++
			for _, c := range res.Calls {
				if strings.HasPrefix(c.Method, "Controller") || c.Method == "CreateVolume" || c.Method == "DeleteVolume" {
					t.Errorf("scenario %s called %s on a node-only plugin", res.Name, c.Method)
				}
			}
		case res.Status == check.Fail:
			t.Errorf("scenario %s: failed (%s: expected %s, got %s)", res.Name, res.Reason, res.Expected, res.Got)
		}
	}
	if passed < 6 {
		t.Errorf("%d scenarios passed on the given volume, want the filesystem ones (at least 6)", passed)
	}
	vols, err := p.Volumes()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range vols {
		found = found || v.ID == handle
	}
	if !found {
		t.Errorf("volume %s, which the check did not create, is gone after the run", handle)
	}
	assertNothingLeft(t, scratch)
}

// TestExpandPublishedDirectoryBacked: a directory-backed volume, as
// csi-driver-host-path's, shows the host's file system to statfs, larger
// than the volume and unchanged by NodeExpandVolume. It offers the size asked
// for, which is all the kubelet relies on: expand-published passes.
func TestExpandPublishedDirectoryBacked(t *testing.T) {
	p := newTestPlugin(t)
	scratch := t.TempDir()
	cfg := p.config(t, scratch)
	cfg.Params = nil // not FUSE-backed: a bind mount of the volume's directory
	cfg.Scenario = regexp.MustCompile(`^expand-published$`)
	report, err := check.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Results) != 1 {
		t.Fatalf("%d scenarios ran, want expand-published alone", len(report.Results))
	}
	if res := report.Results[0]; res.Status != check.Pass {
		t.Errorf("expand-published on a directory-backed volume: %s (%s): expected %s, got %s", res.Status, res.Reason, res.Expected, res.Got)
	}
	assertNothingLeft(t, scratch, p.stateDir)
}
