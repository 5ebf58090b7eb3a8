package bench_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/test/kubelet/benchresults"
)

// scenario is one group of rows of the table. It runs on every column,
// one agent after the other on the same world, EnvRuns times, the columns'
// order alternating between runs: each agent started fresh on a root
// directory of its own, then stopped. A new row is a new scenario, nothing
// else.
type scenario struct {
	// name heads its rows; pods is its N (0: none), which orders the
	// sections of the rendered table (110 first).
	name string
	pods int
	// columns are the columns it runs; nil means mainColumns.
	columns []*column
	// run measures one agent and leaves the world as it found it (pods
	// deleted, every volume torn down).
	run func(ctx context.Context, b *testing.B, w *world, a *agent) []figure
}

// figure is one value measured of one agent.
type figure struct {
	// name says what it is, with its unit; key is its ReportMetric unit
	// (no spaces), e.g. "added_p50_ms".
	name, key string
	value     float64
	// missing marks a figure the agent cannot give; note says why (e.g.
	// "did not finish in 10m").
	missing bool
	note    string
}

// sideBySide runs sc on every column, EnvRuns times in alternating order,
// records every figure of every run as a sample (results.json), prints the
// table (per column the median of the runs and their min–max, the
// kubelet's median ÷ each other column's) and reports every median with
// b.ReportMetric as <column tag>_<key>.
func sideBySide(ctx context.Context, b *testing.B, w *world, sc scenario) {
	b.Helper()
	cols := sc.columns
	if cols == nil {
		cols = mainColumns(b)
	}
	book.setting("runs per row", benchRuns(b))
	for r := range benchRuns(b) {
		for pos, col := range runOrder(cols, r) {
			a := startAgent(ctx, b, w, col, r)
			figs := sc.run(ctx, b, w, a)
			if err := a.stop(b, w); err != nil {
				b.Fatalf("stopping %s: %v", col.id, err)
			}
			book.add(sc.name, sc.pods, col, r, pos, figs)
		}
	}
	printTable(b, sc.name)
}

// printTable prints the section's rows as results.json aggregates them,
// and reports each column's medians.
func printTable(b *testing.B, section string) {
	b.Helper()
	f := book.snapshot()
	var sb strings.Builder
	ref, hasRef := f.Reference()
	for _, r := range f.Rows() {
		if r.Section != section {
			continue
		}
		fmt.Fprintf(&sb, "\n  %-48s", r.Figure)
		for _, c := range f.Columns {
			cell, ok := r.Cells[c.ID]
			if !ok {
				continue
			}
			text := cell.Note
			if cell.N > 0 {
				text = fmt.Sprintf("%s (%s–%s)", benchresults.Format(cell.Median), benchresults.Format(cell.Min), benchresults.Format(cell.Max))
				b.ReportMetric(cell.Median, columnTag(c.ID)+"_"+r.Key)
			}
			fmt.Fprintf(&sb, "  %s: %-22s", c.ID, text)
			if rc, ok := r.Cells[ref.ID]; hasRef && c.ID != ref.ID && ok && rc.N > 0 && cell.N > 0 && cell.Median != 0 && !math.IsNaN(cell.Median) {
				fmt.Fprintf(&sb, " %s×", benchresults.Format(rc.Median/cell.Median))
			}
		}
	}
	details(b, section+" (median of the runs (min–max); × = kubelet ÷ column; load "+loadAverage()+")", sb.String())
}

// columnTag is the tag of the column with that id.
func columnTag(id string) string {
	for _, c := range []*column{colKubelet, colVolmgr, colVolmgrDefaults, colVolmgrWatch} {
		if c.id == id {
			return c.tag
		}
	}
	return "x"
}

// details prints a multi-line part of a benchmark's report to stdout: the
// testing package keeps only the first lines of a benchmark's log.
func details(b *testing.B, title, text string) {
	fmt.Printf("[%s] %s:%s\n", b.Name(), title, text)
}

// EnvAgents names an environment variable that restricts the benchmarks
// to some agents, by name (e.g. "csi-volmgr" while working on it); the
// table then has no ratio. Default: both.
const EnvAgents = "KUBELET_BENCH_AGENTS"

func selected(kind *agentKind) bool {
	s := os.Getenv(EnvAgents)
	return s == "" || slices.Contains(strings.Split(s, ","), kind.name)
}
