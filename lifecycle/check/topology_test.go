package check_test

import (
	"regexp"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// TestCreateVolumeOnTheNodeUnderCheck: a plugin with VOLUME_ACCESSIBILITY_CONSTRAINTS whose
// controller creates node-local volumes only where the CO says (TopoLVM: "can not find any node"
// without accessibility requirements) gets the node's topology from NodeGetInfo as requisite and
// preferred topology, as the external-provisioner passes the selected node, and every scenario
// runs on volumes of the node under check.
func TestCreateVolumeOnTheNodeUnderCheck(t *testing.T) {
	p := newTestPlugin(t)
	p.command += " --topology=topology.test.csi-volmgr.io/node=testnode"
	if err := plugin.WriteFaultConfig(p.control, plugin.FaultConfig{RequireAccessibility: true}); err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	cfg := p.config(t, scratch)
	cfg.Scenario = regexp.MustCompile("^(publish-parallel|block-two-pods)$")
	report, err := check.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Results) != 2 {
		t.Fatalf("results %+v, want publish-parallel and block-two-pods", report.Results)
	}
	for _, res := range report.Results {
		if res.Status != check.Pass {
			t.Errorf("%s: %s (%s: expected %s, got %s)", res.Name, res.Status, res.Reason, res.Expected, res.Got)
		}
		created := 0
		for _, c := range res.Calls {
			if c.Method == "CreateVolume" && c.Code == "OK" {
				created++
			}
		}
		if created == 0 {
			t.Errorf("%s: no CreateVolume answered OK: %+v", res.Name, res.Calls)
		}
	}
	assertNothingLeft(t, scratch)
}
