package check_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// TestRestartsADriverThatExits: a driver of --driver-command that dies
// during a scenario fails that scenario with how it exited and its last
// output; the check restarts it, as its container would be, so that the
// scenario's volume is still torn down and deleted through it and the next
// scenario runs against a live driver.
func TestRestartsADriverThatExits(t *testing.T) {
	p := newTestPlugin(t)
	// Times counts across the plugin's restarts: the restarted driver stages.
	if err := plugin.WriteFaultConfig(p.control, plugin.FaultConfig{Rules: []plugin.FaultRule{
		{Method: "NodeStageVolume", Exit: plugin.ExitBefore, Times: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	cfg := p.config(t, scratch)
	cfg.Scenario = regexp.MustCompile(`^(publish-parallel|repeat-calls)$`)
	report, err := check.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Results) != 2 {
		t.Fatalf("results: %+v", report.Results)
	}
	crashed, next := report.Results[0], report.Results[1]
	if crashed.Status != check.Fail || crashed.Reason != "the driver exited" {
		t.Errorf("publish-parallel: %s (%s), want a failure for the driver's exit", crashed.Status, crashed.Reason)
	}
	for _, want := range []string{"signal: killed", "NodeStageVolume"} {
		if !strings.Contains(crashed.Got, want) {
			t.Errorf("publish-parallel's result %q does not say %q (how the driver exited, its last output)", crashed.Got, want)
		}
	}
	if len(crashed.Cleanup) > 0 {
		t.Errorf("publish-parallel's volume was not torn down through the restarted driver: %q", crashed.Cleanup)
	}
	restarted := false
	for _, c := range crashed.Calls {
		restarted = restarted || c.Method == "(driver restart)"
	}
	if !restarted {
		t.Errorf("publish-parallel's calls show no driver restart: %+v", crashed.Calls)
	}
	if next.Status != check.Pass {
		t.Errorf("repeat-calls after the crash: %s (%s: expected %s, got %s), want it to pass against the restarted driver", next.Status, next.Reason, next.Expected, next.Got)
	}
	vols, err := plugin.LoadState(p.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		t.Errorf("volume %s left in the driver", v.ID)
	}
	assertNothingLeft(t, scratch, p.stateDir)
}
