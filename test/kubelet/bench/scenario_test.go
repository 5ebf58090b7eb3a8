package bench_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

// scenario is one group of rows of the side-by-side table. It runs once
// on each agent, one after the other, on the same world: each agent
// started fresh on a root directory of its own, then stopped. The rows of
// issue 17 are scenarios; a new row is a new scenario, nothing else.
type scenario struct {
	// name heads its rows.
	name string
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

// sideBySide runs sc on every agent in turn, prints the table (kubelet,
// csi-volmgr, ratio kubelet ÷ csi-volmgr) and reports every figure with
// b.ReportMetric as <agent>_<key>, and the ratio as ratio_<key>.
func sideBySide(ctx context.Context, b *testing.B, w *world, sc scenario) {
	b.Helper()
	results := make([][]figure, len(agents))
	for i, kind := range agents {
		if !selected(kind) {
			continue
		}
		a := startAgent(ctx, b, w, kind)
		results[i] = sc.run(ctx, b, w, a)
		if err := a.stop(b, w); err != nil {
			b.Fatalf("stopping %s: %v", kind.name, err)
		}
	}
	printTable(b, sc.name, results)
	book.add(sc.name, results)
}

// printTable prints the figures of every agent side by side, in the order
// of the first agent's, and reports them.
func printTable(b *testing.B, title string, results [][]figure) {
	b.Helper()
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n  %-48s", "figure")
	for _, kind := range agents {
		fmt.Fprintf(&sb, " %12s", kind.name)
	}
	fmt.Fprintf(&sb, " %10s", "ratio")
	for _, f := range firstResults(results) {
		fmt.Fprintf(&sb, "\n  %-48s", f.name)
		values := make([]figure, len(agents))
		for i, kind := range agents {
			v, ok := find(results[i], f.key)
			v.missing = v.missing || !ok
			values[i] = v
			if !ok || v.missing {
				text := "n/a"
				if v.note != "" {
					text = v.note
				}
				fmt.Fprintf(&sb, " %12s", text)
				continue
			}
			fmt.Fprintf(&sb, " %12.2f", v.value)
			b.ReportMetric(v.value, kind.short+"_"+f.key)
		}
		if r, ok := ratio(values[0], values[1]); ok {
			fmt.Fprintf(&sb, " %9.1f×", r)
			b.ReportMetric(r, "ratio_"+f.key)
		} else {
			fmt.Fprintf(&sb, " %10s", "")
		}
	}
	details(b, title+" (one run of each agent on the same objects; ratio = kubelet ÷ csi-volmgr; load "+loadAverage()+")", sb.String())
}

func find(figs []figure, key string) (figure, bool) {
	for _, f := range figs {
		if f.key == key {
			return f, true
		}
	}
	return figure{}, false
}

// ratio is a ÷ b when both are there and b is not zero.
func ratio(a, b figure) (float64, bool) {
	if a.missing || b.missing || b.value == 0 || math.IsNaN(a.value) || math.IsNaN(b.value) {
		return 0, false
	}
	return a.value / b.value, true
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

// firstResults is the figures of the first agent that ran.
func firstResults(results [][]figure) []figure {
	for _, r := range results {
		if r != nil {
			return r
		}
	}
	return nil
}
