package bench_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// The cost model of the plan: what one agent run of each kind of row takes
// on the 2-core development machine, from the smoke run of 2026-11-27
// (two runs of every row at small counts while other work ran: an agent's
// start and stop 1–1.5 s, 30-pod bursts and 5 serial pods within these
// figures) and the earlier full runs at scale (a burst of 1,000: the
// kubelet 78 s, csi-volmgr 16 s; serial pods: the kubelet about 0.3 s
// each, csi-volmgr the 0.1 s interval). Rounded up: the plan is an
// estimate and says so.
var costModel = struct {
	// start is an agent's start until it registered the driver, plus its
	// stop.
	start map[string]time.Duration
	// serialPod, burstPod, teardownPod are per pod; attachWait is what
	// an agent adds to the attach lag per pod.
	serialPod, burstPod, teardownPod, attachWait map[string]time.Duration
	// volume is the world's setup per volume (CSI volume, PVC, PV).
	volume time.Duration
}{
	start:       map[string]time.Duration{"kubelet": 2 * time.Second, "csi-volmgr": 2 * time.Second},
	serialPod:   map[string]time.Duration{"kubelet": 350 * time.Millisecond, "csi-volmgr": 110 * time.Millisecond},
	burstPod:    map[string]time.Duration{"kubelet": 80 * time.Millisecond, "csi-volmgr": 20 * time.Millisecond},
	teardownPod: map[string]time.Duration{"kubelet": 60 * time.Millisecond, "csi-volmgr": 20 * time.Millisecond},
	attachWait:  map[string]time.Duration{"kubelet": 9 * time.Second, "csi-volmgr": 200 * time.Millisecond},
	volume:      10 * time.Millisecond,
}

// planRow is one line of the plan.
type planRow struct {
	what string
	took time.Duration
}

// plan is what the benchmarks will run with this environment, and the
// estimated time of each part.
func plan(tb testing.TB) ([]planRow, []*column, int) {
	tb.Helper()
	runs := benchRuns(tb)
	cols := mainColumns(tb)
	c := costModel
	// perRuns is one run of every column, times the runs.
	perRuns := func(f func(agent string) time.Duration) time.Duration {
		var d time.Duration
		for _, col := range cols {
			d += c.start[col.kind.name] + f(col.kind.name)
		}
		return d * time.Duration(runs)
	}
	var rows []planRow
	add := func(what string, d time.Duration) { rows = append(rows, planRow{what, d}) }
	idle := idleWindow(tb)
	for _, n := range podCounts(tb) {
		add(fmt.Sprintf("%d pods one after another", n), perRuns(func(a string) time.Duration {
			return time.Duration(n)*(c.serialPod[a]+c.teardownPod[a]) + idleSettle + idle
		}))
	}
	burstIdle := durationEnv(tb, EnvBurstIdle, 10*time.Second)
	for _, n := range intList(tb, EnvBurst, []int{0, 110, 1000}) {
		add(fmt.Sprintf("burst of %d pods", n), perRuns(func(a string) time.Duration {
			return time.Duration(n)*(c.burstPod[a]+c.teardownPod[a]) + idleSettle + burstIdle
		}))
	}
	attachPods := intList(tb, EnvAttachPods, []int{5})[0]
	for _, lag := range attachLags(tb) {
		add(fmt.Sprintf("attach lag %v, %d pods", lag, attachPods), perRuns(func(a string) time.Duration {
			return time.Duration(attachPods) * (lag + c.attachWait[a])
		}))
	}
	add("50 pods on one RWX volume", perRuns(func(a string) time.Duration {
		if a == "kubelet" {
			return 15 * time.Second
		}
		return 3 * time.Second
	}))
	foreign := intList(tb, EnvForeign, []int{20000})[0]
	add(fmt.Sprintf("API cost: %d pods, %d foreign objects", apiPods, foreign), perRuns(func(a string) time.Duration {
		return apiPods*(c.serialPod[a]+c.teardownPod[a]) + idle + 10*time.Second + time.Duration(foreign)*2*time.Millisecond
	}))
	window := durationEnv(tb, EnvSteadyWindow, 15*time.Minute)
	steadyCols := len(cols)
	if watchAllColumn() {
		steadyCols++
	}
	var steadySetup time.Duration
	var volumes int
	for _, n := range intList(tb, EnvSteadyPods, []int{110, 1000}) {
		volumes += n * steadyCols
		for _, col := range cols {
			steadySetup += c.start[col.kind.name] + time.Duration(n)*(c.burstPod[col.kind.name]+c.teardownPod[col.kind.name])
		}
		if watchAllColumn() {
			steadySetup += c.start["csi-volmgr"] + time.Duration(n)*(c.burstPod["csi-volmgr"]+c.teardownPod["csi-volmgr"])
		}
	}
	add(fmt.Sprintf("steady state: %d agents in one window of %v", steadyCols*len(intList(tb, EnvSteadyPods, []int{110, 1000})), window),
		time.Duration(runs)*(steadySetup+steadySettle+window))
	add(fmt.Sprintf("worlds: %d volumes with PVCs and PVs", volumes+1000+110+attachPods+apiPods+1), time.Duration(volumes+1000+110+attachPods+apiPods+1)*c.volume)
	add(fmt.Sprintf("by-name watches on kube-apiserver (%d)", intList(tb, EnvWatches, []int{10000})[0]), 4*time.Minute)
	add("floors, harness tests", 2*time.Minute)
	return rows, cols, runs
}

// TestPlan prints what the benchmarks will run with this environment and
// how long it should take here (make bench-kubelet-plan; make
// bench-kubelet prints it first). It measures nothing.
func TestPlan(t *testing.T) {
	rows, cols, runs := plan(t)
	var sb strings.Builder
	var total time.Duration
	ids := make([]string, len(cols))
	for i, c := range cols {
		ids[i] = c.id
	}
	fmt.Fprintf(&sb, "plan: columns %s; %d runs per row, order alternating; estimated on the 2-core machine:\n", strings.Join(ids, ", "), runs)
	for _, r := range rows {
		fmt.Fprintf(&sb, "  %-60s %6.1f min\n", r.what, r.took.Minutes())
		total += r.took
	}
	fmt.Fprintf(&sb, "  %-60s %6.1f min (estimate)\n", "total", total.Minutes())
	fmt.Fprint(os.Stdout, sb.String())
}
