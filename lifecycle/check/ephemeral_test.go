package check_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/check"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// TestEphemeralInlineVolumes: with Ephemeral the check publishes CSI inline
// volumes as the kubelet does (volume_id csi-<sha256>, the pod's information
// and csi.storage.k8s.io/ephemeral=true in volume_context: the test plugin
// makes an inline volume only then, and fails the publish of an unknown
// volume otherwise), never creates, attaches or stages them, and skips with
// the reason the scenarios an inline volume cannot go through.
func TestEphemeralInlineVolumes(t *testing.T) {
	p := newTestPlugin(t)
	scratch := t.TempDir()
	cfg := p.config(t, scratch)
	cfg.Ephemeral = true
	cfg.VolumeContext = map[string]string{"size": "small"}
	report, err := check.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	skipped := map[string]string{
		"publish-parallel":        "one pod's own",
		"readonly-readwrite":      "one pod's own",
		"data-survives-republish": "not meant to survive",
		"block-two-pods":          "cannot be block volumes",
		"expand-published":        "never expanded",
		"uncertain-stage":         "never staged",
		"crash-after-stage":       "never staged",
	}
	passed := 0
	for _, res := range report.Results {
		if why, ok := skipped[res.Name]; ok {
			if res.Status != check.Skipped || !strings.Contains(res.Reason, "ephemeral inline volume (--ephemeral)") || !strings.Contains(res.Reason, why) {
				t.Errorf("scenario %s: %s (%s), want skipped: an inline volume %s", res.Name, res.Status, res.Reason, why)
			}
			continue
		}
		if res.Status != check.Pass {
			t.Errorf("scenario %s: %s (%s: expected %s, got %s)", res.Name, res.Status, res.Reason, res.Expected, res.Got)
			continue
		}
		passed++
		for _, c := range res.Calls {
			switch c.Method {
			case "CreateVolume", "DeleteVolume", "ControllerPublishVolume", "ControllerUnpublishVolume", "NodeStageVolume", "NodeUnstageVolume":
				t.Errorf("scenario %s called %s for an inline volume", res.Name, c.Method)
			}
		}
	}
	for _, name := range []string{"repeat-calls", "teardown-unmounted", "crash-after-unpublish", "driver-restart"} {
		if statuses(report)[name] != check.Pass {
			t.Errorf("scenario %s did not pass on inline volumes", name)
		}
	}
	t.Logf("%d scenarios passed on inline volumes", passed)
	assertNothingLeft(t, scratch, p.stateDir)
}

// TestEphemeralReadOnly: with ReadOnly every NodePublishVolume says
// readonly (drivers such as csi.cert-manager.io refuse anything else), the
// scenarios that write into the volume are skipped naming --read-only, and
// driver-restart checks the driver's files instead of writing its own. A
// persistent check cannot be read-only.
func TestEphemeralReadOnly(t *testing.T) {
	p := newTestPlugin(t)
	scratch := t.TempDir()
	cfg := p.config(t, scratch)
	cfg.Ephemeral, cfg.ReadOnly = true, true
	report, err := check.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := statuses(report)
	for _, name := range []string{"repeat-calls", "teardown-unmounted", "crash-after-unpublish", "driver-restart"} {
		if st[name] != check.Pass {
			t.Errorf("scenario %s: %s, want pass on read-only inline volumes", name, st[name])
		}
	}
	for _, res := range report.Results {
		switch res.Name {
		case "volume-stats", "volume-mount-group":
			if res.Status != check.Skipped || !strings.Contains(res.Reason, "--read-only") {
				t.Errorf("scenario %s: %s (%s), want skipped naming --read-only", res.Name, res.Status, res.Reason)
			}
		}
	}
	entries, err := plugin.ReadJournal(filepath.Join(p.dir, "journal.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	publishes := 0
	for _, e := range entries {
		if e.Method == "NodePublishVolume" && e.Event == plugin.EventBegin {
			publishes++
			if !e.ReadOnly {
				t.Errorf("NodePublishVolume of %s at %s without readonly", e.VolumeID, e.TargetPath)
			}
		}
	}
	if publishes == 0 {
		t.Error("the journal has no NodePublishVolume")
	}
	assertNothingLeft(t, scratch, p.stateDir)

	cfg = p.config(t, t.TempDir())
	cfg.ReadOnly = true
	if _, err := check.Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("a read-only check of persistent volumes: error %v, want one saying read-only is for inline volumes", err)
	}
}
