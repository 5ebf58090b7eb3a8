package check_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// TestRestartsADriverThatDies: a driver of --driver-command that dies
// during a scenario fails that scenario with what happened and its last
// output; the check ends what is left of the command and starts it again,
// as a container runtime restarts a container, so that the scenario's
// volume is still torn down and deleted through it and the next scenario
// runs against a live driver. The driver dies as a panic kills it: the
// whole command (exec), or under a wrapper that outlives it (a shell that
// goes on), whose process the check must end.
func TestRestartsADriverThatDies(t *testing.T) {
	for name, tc := range map[string]struct {
		wrap func(command, marker string) string
		want string
	}{
		"exec":    {wrap: func(c, _ string) string { return c }, want: "signal: killed"},
		"wrapped": {wrap: func(c, marker string) string { return strings.TrimPrefix(c, "exec ") + "; exec sleep " + marker }, want: "no longer answers"},
	} {
		t.Run(name, func(t *testing.T) {
			p := newTestPlugin(t)
			// Times counts across the plugin's restarts: the restarted driver stages.
			if err := plugin.WriteFaultConfig(p.control, plugin.FaultConfig{Rules: []plugin.FaultRule{
				{Method: "NodeStageVolume", Exit: plugin.ExitBefore, Times: 1},
			}}); err != nil {
				t.Fatal(err)
			}
			// A sleep of its own length, to find it among the processes.
			marker := "7" + strings.TrimPrefix(filepath.Base(p.dir), "ck")
			p.command = tc.wrap(p.command, marker)
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
			died, next := report.Results[0], report.Results[1]
			if died.Status != check.Fail || died.Reason != "the driver died" {
				t.Errorf("publish-parallel: %s (%s), want a failure for the driver's death", died.Status, died.Reason)
			}
			for _, want := range []string{tc.want, "NodeStageVolume"} {
				if !strings.Contains(died.Got, want) {
					t.Errorf("publish-parallel's result %q does not say %q (what happened, the driver's last output)", died.Got, want)
				}
			}
			if len(died.Cleanup) > 0 {
				t.Errorf("publish-parallel's volume was not torn down through the restarted driver: %q", died.Cleanup)
			}
			restarted := false
			for _, c := range died.Calls {
				restarted = restarted || c.Method == "(driver restart)"
			}
			if !restarted {
				t.Errorf("publish-parallel's calls show no driver restart: %+v", died.Calls)
			}
			if next.Status != check.Pass {
				t.Errorf("repeat-calls after the death: %s (%s: expected %s, got %s), want it to pass against the restarted driver", next.Status, next.Reason, next.Expected, next.Got)
			}
			vols, err := plugin.LoadState(p.stateDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range vols {
				t.Errorf("volume %s left in the driver", v.ID)
			}
			if pids := processesWithArg(t, marker); len(pids) > 0 {
				t.Errorf("what was left of the dead driver's command still runs: %v", pids)
			}
			assertNothingLeft(t, scratch, p.stateDir)
		})
	}
}

// processesWithArg returns the processes with arg among their arguments.
func processesWithArg(t *testing.T, arg string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range strings.Split(string(b), "\x00") {
			if a == arg {
				out = append(out, e.Name())
			}
		}
	}
	return out
}
