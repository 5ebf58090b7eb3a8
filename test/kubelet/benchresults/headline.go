package benchresults

import (
	"fmt"
	"strings"
)

// headlineRow is one row of the headline table: the figure of key in the
// first section with pods pods (0: any).
type headlineRow struct {
	label, key string
	pods       int
}

// headlineRows are the figures a reader of README wants first: a node at
// the kubelet's max-pods, a burst, the steady state, memory.
var headlineRows = []headlineRow{
	{"110 pods one after another: added latency p50 (ms)", "added_p50_ms", 110},
	{"110 pods one after another: added latency p99 (ms)", "added_p99_ms", 110},
	{"burst of 110 pods: per-pod p99, create → published (s)", "burst_p99_s", 110},
	{"burst of 1,000 pods: per-pod p99, create → published (s)", "burst_p99_s", 1000},
	{"burst of 1,000 pods: agent CPU (s)", "burst_cpu_s", 1000},
	{"heap per volume, 1,000 volumes (KiB)", "heap_per_volume_kib", 1000},
	{"steady state, 110 volumes: CPU (ms per min)", "steady_cpu_ms_per_min", 110},
	{"steady state, 110 volumes: API requests per pod and min", "steady_api_per_pod_min", 110},
	{"steady state, 1,000 volumes: CPU (ms per min)", "steady_cpu_ms_per_min", 1000},
	{"steady state, 1,000 volumes: API requests per pod and min", "steady_api_per_pod_min", 1000},
}

// Headline renders the short table for README: headlineRows for every
// column that has them ("median (min–max)" of the runs, and the
// reference column's median ÷ the column's), the commit and machine in
// one line, and the aims. The whole table is Markdown's.
func (f *File) Headline() string {
	rows := f.Rows()
	var cols []Column
	for _, c := range f.Columns {
		for _, h := range headlineRows {
			if _, ok := f.cell(rows, h.key, h.pods, c.ID); ok {
				cols = append(cols, c)
				break
			}
		}
	}
	ref, hasRef := f.Reference()
	var sb strings.Builder
	m := f.Machine
	fmt.Fprintf(&sb, "Commit `%s` (%s), %s UTC, %d CPUs (%s); each cell the median of %s runs (min–max); ÷: %s's median over the column's.\n\n",
		short(f.Commit), f.TreeState, f.Started.UTC().Format("2006-01-02"), m.NProc, m.CPUModel, runsOf(f), ref.ID)
	sb.WriteString("| figure |")
	align := "|---|"
	for _, c := range cols {
		fmt.Fprintf(&sb, " %s |", c.ID)
		align += "---:|"
		if hasRef && c.ID != ref.ID {
			sb.WriteString(" ÷ |")
			align += "---:|"
		}
	}
	sb.WriteString("\n" + align + "\n")
	for _, h := range headlineRows {
		var line strings.Builder
		have := false
		fmt.Fprintf(&line, "| %s |", h.label)
		refCell, refOK := f.cell(rows, h.key, h.pods, ref.ID)
		for _, c := range cols {
			cell, ok := f.cell(rows, h.key, h.pods, c.ID)
			have = have || ok
			fmt.Fprintf(&line, " %s |", cellText(cell, ok))
			if hasRef && c.ID != ref.ID {
				r := ""
				if refOK {
					r = ratioText(refCell, cell, ok)
				}
				fmt.Fprintf(&line, " %s |", r)
			}
		}
		if have {
			sb.WriteString(line.String() + "\n")
		}
	}
	sb.WriteString("\nThe aims of issue 24, from the same file:\n\n")
	for _, a := range f.Aims() {
		fmt.Fprintf(&sb, "- %s: %s.\n", a.Text, a.Result)
	}
	return sb.String()
}

// runsOf is the runs per row as the settings give it.
func runsOf(f *File) string {
	for _, k := range []string{"runs per row", "runs"} {
		if r, ok := f.Settings[k]; ok {
			return r
		}
	}
	return "the"
}
