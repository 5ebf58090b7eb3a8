package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

// TestDocMatchesResults fails when docs/drivers.md's table is not what the committed results of
// make drivers (docs/drivers/results) render: a result changed, or the table was edited by hand.
func TestDocMatchesResults(t *testing.T) {
	root := filepath.Join("..", "..")
	if err := run(filepath.Join(root, "docs", "drivers", "results"), filepath.Join(root, "docs", "drivers.md"), true, io.Discard); err != nil {
		t.Fatal(err)
	}
}

func sample() driverresult.Result {
	return driverresult.Result{
		Name: "fusefs", Driver: "csi.example.com", Kind: "fuse",
		Module: "example.com/fusefs", Version: "v1.2.3",
		Commit: "abc1234", Date: "2026-11-28T18:00:00Z", Machine: "2 cores, Linux 6.1, go1.26",
		Checks: []driverresult.Step{
			{Name: "publish-parallel", Result: driverresult.Pass, Seconds: 0.5},
			{Name: "block-two-pods", Result: driverresult.Skip, Reason: "no block | filesystem only"},
		},
		Lifecycle: []driverresult.Step{
			{Name: "VolumesReady", Result: driverresult.Pass, Seconds: 3},
		},
		NodePluginFlags: []string{"--endpoint=unix:///csi/csi.sock", "--nodeid=n1"},
		Settings:        []string{"kubeletDir: /var/lib/csi-volmgr"},
		Notes:           []string{"registered without node-driver-registrar"},
		Seconds:         42,
	}
}

const skeleton = "# Drivers\n\nintro\n\n" + BeginMarker + "\nstale\n" + EndMarker + "\n\nafter\n"

// TestChangedResultFailsCheck: a result that changes after its table was rendered makes -check fail
// (the case make test catches), and rendering again makes it pass.
func TestChangedResultFailsCheck(t *testing.T) {
	dir := t.TempDir()
	results, doc := filepath.Join(dir, "results"), filepath.Join(dir, "drivers.md")
	if err := os.WriteFile(doc, []byte(skeleton), 0o644); err != nil {
		t.Fatal(err)
	}
	r := sample()
	if err := driverresult.Write(results, r); err != nil {
		t.Fatal(err)
	}
	if err := run(results, doc, true, io.Discard); err == nil {
		t.Fatal("-check passed on a table never rendered")
	}
	var printed strings.Builder
	if err := run(results, doc, false, &printed); err != nil {
		t.Fatal(err)
	}
	if err := run(results, doc, true, io.Discard); err != nil {
		t.Fatalf("-check right after rendering: %v", err)
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), "# Drivers\n\nintro\n\n"+BeginMarker+"\n") || !strings.HasSuffix(string(b), EndMarker+"\n\nafter\n") {
		t.Errorf("text outside the markers changed:\n%s", b)
	}
	if !strings.Contains(string(b), printed.String()) {
		t.Error("the printed table is not the one written")
	}

	r.Lifecycle[0] = driverresult.Step{Name: "VolumesReady", Result: driverresult.Fail, Reason: "timed out", Seconds: 120}
	if err := driverresult.Write(results, r); err != nil {
		t.Fatal(err)
	}
	err = run(results, doc, true, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("-check after a result changed: %v, want it stale", err)
	}
}

// TestRenderShowsEveryStep: the table says what passed, what failed or was skipped and why, and
// how the node plugin ran, for each driver.
func TestRenderShowsEveryStep(t *testing.T) {
	r := sample()
	r.Checks = append(r.Checks, driverresult.Step{Name: "driver-restart", Result: driverresult.Fail, Reason: "target still ENOTCONN after repair", Seconds: 9})
	out := Render([]driverresult.Result{r})
	for _, want := range []string{
		"| [fusefs](#fusefs) (`csi.example.com`) | fuse | `example.com/fusefs@v1.2.3` | 1 passed, 1 failed, 1 skipped | 1 passed, 0 failed, 0 skipped | 42 |",
		"| check | block-two-pods | skip | 0.0 | no block \\| filesystem only |",
		"| check | driver-restart | **FAIL** | 9.0 | target still ENOTCONN after repair |",
		"| lifecycle | VolumesReady | pass | 3.0 |  |",
		"```\n--endpoint=unix:///csi/csi.sock\n--nodeid=n1\n```",
		"- kubeletDir: /var/lib/csi-volmgr",
		"- registered without node-driver-registrar",
		"`abc1234`, 2026-11-28T18:00:00Z, 2 cores, Linux 6.1, go1.26",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, out)
		}
	}
	if empty := Render(nil); !strings.Contains(empty, "No driver has been run yet") {
		t.Errorf("no results: %q", empty)
	}
}

func TestSpliceNeedsBothMarkersOnce(t *testing.T) {
	for name, doc := range map[string]string{
		"none":     "text",
		"no end":   BeginMarker + "\n",
		"twice":    BeginMarker + EndMarker + BeginMarker + EndMarker,
		"reversed": EndMarker + "\n" + BeginMarker,
	} {
		if _, err := Splice(doc, "t"); err == nil {
			t.Errorf("%s: Splice accepted %q", name, doc)
		}
	}
}
