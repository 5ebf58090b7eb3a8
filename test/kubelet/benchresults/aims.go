package benchresults

import (
	"fmt"
	"strings"
)

// Aim is one aim of issue 24 with what a results file says of it.
type Aim struct {
	// Text is the aim; Result the measured value and whether it is met,
	// or that the file does not hold it.
	Text, Result string
}

// The columns the aims read.
const (
	kubeletColumn   = "kubelet"
	volmgrEqual     = "csi-volmgr@50/100"
	volmgrDefaults  = "csi-volmgr@defaults"
	notInThisFile   = "not in this results file"
	stressRunsThese = " (make bench-kubelet-stress measures it)"
)

// cell is the cell of key in the section with pods pods (the first such
// row), for column.
func (f *File) cell(rows []Row, key string, pods int, column string) (Cell, bool) {
	for _, r := range rows {
		if r.Key == key && r.Pods == pods {
			c, ok := r.Cells[column]
			return c, ok && c.N > 0
		}
	}
	return Cell{}, false
}

// Aims are the aims of issue 24 with the file's measured values.
func (f *File) Aims() []Aim {
	rows := f.Rows()
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "not met"
	}
	var out []Aim

	// Per-pod p99, 110-pod burst, equal budgets: ≥ 10× the kubelet's.
	a := Aim{Text: "per-pod p99 from pod creation to published, 110-pod burst, equal budgets: at least 10× better than the kubelet", Result: notInThisFile}
	if k, ok := f.cell(rows, "burst_p99_s", 110, kubeletColumn); ok {
		if v, ok := f.cell(rows, "burst_p99_s", 110, volmgrEqual); ok && v.Median > 0 {
			r := k.Median / v.Median
			a.Result = fmt.Sprintf("%s× (kubelet %s s, csi-volmgr %s s, medians): %s", Format(r), Format(k.Median), Format(v.Median), met(r >= 10))
		}
	}
	out = append(out, a)

	// Heap per volume at 5,000 volumes < 4 KiB.
	a = Aim{Text: "memory per managed volume under 4 KiB of heap at 5,000 volumes", Result: notInThisFile + stressRunsThese}
	var parts []string
	for _, col := range []string{volmgrEqual, volmgrDefaults} {
		if c, ok := f.cell(rows, "heap_per_volume_kib", 5000, col); ok {
			parts = append(parts, fmt.Sprintf("%s: %s KiB, %s", col, Format(c.Median), met(c.Median < 4)))
		}
	}
	if len(parts) > 0 {
		a.Result = strings.Join(parts, "; ")
	}
	out = append(out, a)

	// Restart with 5,000 intact volumes ready in < 2 s with 0 CSI calls.
	a = Aim{Text: "restart with 5,000 intact volumes: every pod ready in under 2 s, with 0 CSI calls", Result: notInThisFile + stressRunsThese}
	parts = nil
	for _, col := range []string{volmgrEqual, volmgrDefaults} {
		ready, ok := f.cell(rows, "restart_pods_ready_s", 5000, col)
		stage, ok2 := f.cell(rows, "restart_stage_calls", 5000, col)
		publish, ok3 := f.cell(rows, "restart_publish_calls", 5000, col)
		if ok && ok2 && ok3 {
			calls := stage.Median + publish.Median
			parts = append(parts, fmt.Sprintf("%s: %s s, %s CSI calls, %s", col, Format(ready.Median), Format(calls), met(ready.Median < 2 && calls == 0)))
		}
	}
	if len(parts) > 0 {
		a.Result = strings.Join(parts, "; ")
	}
	out = append(out, a)

	// API server cost by default no worse than the kubelet's at 5,000 ×
	// 110, memory and CPU.
	a = Aim{Text: "API-server cost by default no worse than the kubelet's at 5,000 nodes × 110 pods (memory and CPU, watches and GETs)", Result: notInThisFile}
	kh, ok1 := f.cell(rows, "apiserver_heap_gib", 0, kubeletColumn)
	kc, ok2 := f.cell(rows, "apiserver_cpu_cores", 0, kubeletColumn)
	vh, ok3 := f.cell(rows, "apiserver_heap_gib", 0, volmgrDefaults)
	vc, ok4 := f.cell(rows, "apiserver_cpu_cores", 0, volmgrDefaults)
	if ok1 && ok2 && ok3 && ok4 {
		a.Result = fmt.Sprintf("by default %s GiB heap and %s cores against the kubelet's %s GiB and %s cores (extrapolated): %s",
			Format(vh.Median), Format(vc.Median), Format(kh.Median), Format(kc.Median), met(vh.Median <= kh.Median && vc.Median <= kc.Median))
	}
	out = append(out, a)
	return out
}
