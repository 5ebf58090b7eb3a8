package check_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// TestDriverRestartStrictDriver: against the test plugin in strict mode (a
// NodePublishVolume over a broken target fails as a stock FUSE driver's
// does; a target published over is recorded twice and blocks the unstage,
// as csi-driver-host-path does), the mounts a driver restart broke are
// repaired by tearing them down first, in the kubelet's order
// (NodeUnpublishVolume of the targets, NodeUnstageVolume, NodeStageVolume,
// NodePublishVolume), and once the pods are gone the volume is unstaged.
func TestDriverRestartStrictDriver(t *testing.T) {
	p := newTestPlugin(t)
	if err := plugin.WriteFaultConfig(p.control, plugin.FaultConfig{Strict: true}); err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	cfg := p.config(t, scratch)
	cfg.Scenario = regexp.MustCompile("^driver-restart$")
	report, err := check.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Results) != 1 {
		t.Fatalf("results %+v, want driver-restart only", report.Results)
	}
	res := report.Results[0]
	var calls []string
	restarted := false
	for _, c := range res.Calls {
		if c.Method == "(driver restart)" {
			restarted = true
			continue
		}
		if restarted && strings.HasPrefix(c.Method, "Node") && !strings.HasPrefix(c.Method, "NodeGet") {
			calls = append(calls, c.Method+" "+c.Code)
		}
	}
	if res.Status != check.Pass {
		t.Fatalf("driver-restart: %s (%s: expected %s, got %s); calls after the restart %q", res.Status, res.Reason, res.Expected, res.Got, calls)
	}
	want := []string{
		// The repair of the broken staging path, and of the targets on it.
		"NodeUnpublishVolume OK", "NodeUnpublishVolume OK", "NodeUnstageVolume OK", "NodeStageVolume OK",
		"NodePublishVolume OK", "NodePublishVolume OK",
		// The pods gone.
		"NodeUnpublishVolume OK", "NodeUnpublishVolume OK", "NodeUnstageVolume OK",
	}
	if !slices.Equal(calls, want) {
		t.Errorf("node calls after the restart %q, want %q", calls, want)
	}
	assertNothingLeft(t, scratch)
}
