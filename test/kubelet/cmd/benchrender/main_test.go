package main

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRender renders the fixture into a Markdown file with markers and
// the charts, and checks the table's cells (median and min–max of the
// runs, a run without a value, the ratio of the medians), the sections'
// order (110 pods first, sections without a pod count last), that the
// text outside the markers stays, and that the charts are well-formed SVG.
func TestRender(t *testing.T) {
	dir := t.TempDir()
	beginMarker, endMarker := markers("")
	md := filepath.Join(dir, "perf.md")
	text := renderFixture(t, md, "# Before\n\n"+beginMarker+"\nold table\n"+endMarker+"\n\nAfter.\n", "-svg", dir)
	for _, want := range []string{
		"# Before\n\n" + beginMarker + "\n",
		"rendered by test/kubelet/cmd/benchrender from testdata/results.json",
		"Commit `0123456789ab` (clean)",
		"2 CPUs (Test CPU), 8.0 GiB memory, kernel 6.1.0",
		"load average 0.10 0.20 0.30 before, 1.00 1.10 1.20 after",
		"`budgets=equal,defaults`, `runs=3`",
		"| figure | kubelet | csi-volmgr@50/100 | kubelet ÷ |",
		// kubelet: 80, 70 and a run that did not finish: median of two.
		"| p99 (s) | 75.0 (70.0–80.0) [2 of 3 runs; did not finish] | 18.0 (16.0–20.0) | 4.17× |",
		"| p99 (s) | 12.0 | 1.00 | 12.0× |",
		"- per-pod p99 from pod creation to published, 110-pod burst, equal budgets: at least 10× better than the kubelet: 12.0× (kubelet 12.0 s, csi-volmgr 1.00 s, medians): met.",
		"- memory per managed volume under 4 KiB of heap at 5,000 volumes: not in this results file (make bench-kubelet-stress measures it).",
		"| attached → stage p50 (ms) | 8000 |",
		"- floor: GET p50 0.7 ms",
		endMarker + "\n\nAfter.\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("rendered Markdown lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "old table") {
		t.Error("the old table is still there")
	}
	i110, i1000, iAttach := strings.Index(text, "#### burst: 110 pods"), strings.Index(text, "#### burst: 1000 pods"), strings.Index(text, "#### attach")
	if i110 < 0 || i1000 < i110 || iAttach < i1000 {
		t.Errorf("sections out of order (110 at %d, 1000 at %d, attach at %d)", i110, i1000, iAttach)
	}

	svg, err := os.ReadFile(filepath.Join(dir, "burst-p99.svg"))
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(strings.NewReader(string(svg)))
	for {
		if _, err := dec.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("burst-p99.svg: %v", err)
			}
			break
		}
	}
	if n := strings.Count(string(svg), "<polyline"); n != 2 {
		t.Errorf("burst-p99.svg has %d lines, want 2 (one per column)", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "steady-cpu.svg")); !os.IsNotExist(err) {
		t.Errorf("steady-cpu.svg drawn without data: %v", err)
	}

	// Rendering twice gives the same file.
	if err := run([]string{"-in", "testdata/results.json", "-md", md}); err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(md)
	if string(again) != text {
		t.Error("a second rendering changed the file")
	}
}

// TestRenderHeadline: -headline renders README's short table into its
// own markers: the headline figures the file has (the 110- and
// 1,000-pod bursts' p99 here), none it lacks, and the aims.
func TestRenderHeadline(t *testing.T) {
	beginMarker, endMarker := markers("readme")
	text := renderFixture(t, filepath.Join(t.TempDir(), "README.md"), "# README\n\n"+beginMarker+"\nold\n"+endMarker+"\n",
		"-name", "readme", "-headline")
	for _, want := range []string{
		"Commit `0123456789ab` (clean)",
		"| figure | kubelet | csi-volmgr@50/100 | ÷ |",
		"| burst of 110 pods: per-pod p99, create → published (s) | 12.0 | 1.00 | 12.0× |",
		"| burst of 1,000 pods: per-pod p99, create → published (s) | 75.0 (70.0–80.0) [2 of 3 runs; did not finish] | 18.0 (16.0–20.0) | 4.17× |",
		"- per-pod p99 from pod creation to published, 110-pod burst, equal budgets: at least 10× better than the kubelet: 12.0×",
		endMarker,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("headline lacks %q:\n%s", want, text)
		}
	}
	for _, unwanted := range []string{"\nold\n", "steady state", "attached → stage"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("headline has %q:\n%s", unwanted, text)
		}
	}
}

// renderFixture writes text to the Markdown file md, renders the fixture
// results into it with the further flags, and returns what md then holds.
func renderFixture(t *testing.T, md, text string, flags ...string) string {
	t.Helper()
	if err := os.WriteFile(md, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(append([]string{"-in", "testdata/results.json", "-md", md}, flags...)); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
