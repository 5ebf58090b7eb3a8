package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
	"github.com/csi-volmgr/csi-volmgr/test/kubelet/kubeletvm"
)

const (
	// EnvSteadyPods names an environment variable with the volume counts
	// of BenchmarkSteadyState (default 110,1000).
	EnvSteadyPods = "KUBELET_BENCH_STEADY_PODS"
	// EnvSteadyWindow names an environment variable with its window
	// (default 15m: at least twice the longest period of either agent,
	// csi-volmgr's settled re-read at 5 min ± 50 %).
	EnvSteadyWindow = "KUBELET_BENCH_STEADY_WINDOW"
	// steadySettle is how long every agent is left alone after the last
	// one published its pods, before the window begins.
	steadySettle = 10 * time.Second
)

// The agents' periods in steady state, from their code and defaults; the
// analytic cost per pod per minute is derived from them (analyticPerPodMin).
const (
	// kubeletResyncJitter is the kubelet's pod worker resync jitter
	// (pkg/kubelet/pod_workers.go workerResyncIntervalJitterFactor): a
	// pod is synced again SyncFrequency × U[1, 1.5] after its last sync.
	kubeletResyncJitter = 0.5
	// kubeletGetsPerSync: each sync's WaitForAttachAndMount marks the pod
	// for reprocessing, and the populator's createVolumeSpec GETs the PVC
	// and then the PV of each PVC volume (pkg/kubelet/volumemanager/
	// populator, getPVCExtractPV and getPVSpec): two GETs per pod here.
	kubeletGetsPerSync = 2
	// volmgrMinWatchTimeout is csi-volmgr's by-name watches' minimum
	// timeout (lifecycle/source/byname.go minWatchTimeout, 30 min); the
	// reflector opens each watch again after U[1, 2] × it.
	volmgrMinWatchTimeout = 30 * time.Minute
	// volmgrWatchesPerPod: a by-name watch of the PVC and of the PV.
	volmgrWatchesPerPod = 2
	// volmgrClaimResync caps the period of a settled claim's re-read
	// (lifecycle/source/settle.go claimResync, ± 25 %), so that an
	// expansion is seen as soon as the kubelet sees it.
	volmgrClaimResync = time.Minute
)

// watchAllColumn says whether the steady state runs colVolmgrWatch: not
// under the Node's identity (EnvIdentity), which watches no claim, volume
// or attachment (csi-volmgr refuses --settled-object-resync=0 with
// --node-identity).
func watchAllColumn() bool { return selected(volmgr) && agentIdentity != identityNode }

// volmgrSettledResync is csi-volmgr's default --settled-object-resync: a
// settled PV is read again every period ± 50 %, a settled PVC every
// min(period, volmgrClaimResync) (lifecycle/source/settle.go), and
// neither is watched any longer.
var volmgrSettledResync = config.Defaults().SettledObjectResync.Duration

// analyticPerPodMin is the steady-state API requests per pod per minute
// the column's agent makes by its code and flags, and the formula.
func analyticPerPodMin(col *column) (float64, string) {
	switch {
	case col.kind == kubelet:
		sync := kubeletvm.Defaults().SyncFrequency.Duration
		mean := sync.Minutes() * (1 + kubeletResyncJitter/2)
		return kubeletGetsPerSync / mean, fmt.Sprintf("%d GETs per sync ÷ (SyncFrequency %v × 1.25)", kubeletGetsPerSync, sync)
	case slices.Contains(col.args, "--settled-object-resync=0"):
		mean := volmgrMinWatchTimeout.Minutes() * 1.5
		return volmgrWatchesPerPod / mean, fmt.Sprintf("%d watches re-opened every %v × U[1,2]", volmgrWatchesPerPod, volmgrMinWatchTimeout)
	}
	claim := min(volmgrSettledResync, volmgrClaimResync)
	return 1/claim.Minutes() + 1/volmgrSettledResync.Minutes(),
		fmt.Sprintf("1 GET of the claim ÷ %v + 1 GET of the volume ÷ %v (settled re-reads)", claim, volmgrSettledResync)
}

// steadySlot is one agent of the steady-state window: a column at a
// volume count, on a world (Node, plugin, volumes) of its own behind a
// counting proxy.
type steadySlot struct {
	col   *column
	n     int
	w     *world
	proxy *countingProxy
	a     *agent
}

// BenchmarkSteadyState measures what each agent costs when nothing
// changes, over one window long enough for every periodic work of both
// (EnvSteadyWindow, default 15m), at each volume count of EnvSteadyPods:
// every column at every count runs in the same window, each on a Node,
// plugin and volumes of its own on the one API server, each behind a
// counting proxy of its own. Per run, the agents are started one after the
// other (the order alternating between runs), each gets its N pods at once
// and publishes them; after steadySettle the window begins. Per agent:
//
//   - CPU over the window in ns (/proc/<pid>/task/*/schedstat, every
//     thread; the 10 ms ticks of /proc/<pid>/stat beside it), per minute
//     and per volume and minute;
//   - API requests over the window, per minute, by verb (GET, LIST,
//     WATCH opened, writes), per pod and minute, next to the analytic
//     requests per pod and minute of its periods (analyticPerPodMin);
//     the most watches open;
//   - RSS and Go heap after a GC, after the window.
//
// Then every pod is deleted and each agent tears its volumes down.
//
//	make bench-kubelet   (or: go test -run='^$' -bench=SteadyState -benchtime=1x ./bench/)
func BenchmarkSteadyState(b *testing.B) {
	counts := intList(b, EnvSteadyPods, []int{110, 1000})
	window := durationEnv(b, EnvSteadyWindow, 15*time.Minute)
	cutoff := durationEnv(b, EnvCutoff, 10*time.Minute)
	teardownCutoff := durationEnv(b, EnvTeardownCutoff, 5*time.Minute)
	cols := mainColumns(b)
	if watchAllColumn() {
		cols = append(cols, colVolmgrWatch)
	} else if selected(volmgr) {
		book.note("steady state: no column %s under the Node's identity: the Node authorizer lets a node watch no claims or volumes, so csi-volmgr --node-identity refuses --settled-object-resync=0", colVolmgrWatch.id)
	}
	book.setting("steady-state window", window)
	book.setting("steady-state volumes", counts)
	for _, col := range cols {
		v, formula := analyticPerPodMin(col)
		book.note("steady state, analytic API requests per pod per minute of %s: %s = %.3f", col.id, formula, v)
	}
	ctx := b.Context()
	var slots []*steadySlot
	for _, n := range counts {
		for _, col := range cols {
			w := newWorld(ctx, b, worldOptions{driver: fmt.Sprintf("steady%d-%s.kubelet-bench.csi-volmgr.io", len(slots), col.tag), volumes: n})
			s := &steadySlot{col: col, n: n, w: w, proxy: startProxy(b, w)}
			w.proxy = s.proxy
			slots = append(slots, s)
		}
	}
	section := func(n int) string {
		return fmt.Sprintf("steady state: %d volumes published, nothing changing, one window of %v", n, window)
	}
	for range b.N {
		for r := range benchRuns(b) {
			order := slots
			if r%2 == 1 {
				order = make([]*steadySlot, len(slots))
				for i, s := range slots {
					order[len(slots)-1-i] = s
				}
			}
			for _, s := range order {
				s.a = startAgent(ctx, b, s.w, s.col, r)
				sent, _ := s.w.createBurst(ctx, b, s.a, s.n)
				if _, ok := s.w.waitBurst(ctx, b, sent, cutoff); !ok {
					b.Fatalf("steady state: %s did not publish %d pods within %v", s.col.id, s.n, cutoff)
				}
			}
			sleepCtx(ctx, b, steadySettle)
			type start struct {
				cpu, ticks time.Duration
				at         time.Time
			}
			starts := make([]start, len(order))
			for i, s := range order {
				s.proxy.take()
				starts[i] = start{cpu: schedCPU(b, s.a), ticks: agentCPU(b, s.a), at: time.Now()}
			}
			b.Logf("steady state, run %d: %d agents publishing, window of %v from %s", r, len(order), window, time.Now().UTC().Format(time.TimeOnly))
			sleepCtx(ctx, b, window)
			figs := make([][]figure, len(order))
			for i, s := range order {
				cpu, ticks := schedCPU(b, s.a)-starts[i].cpu, agentCPU(b, s.a)-starts[i].ticks
				minutes := time.Since(starts[i].at).Minutes()
				counts, maxOpen := s.proxy.take()
				text, verbs := summarize(counts)
				details(b, fmt.Sprintf("%s, %d volumes, run %d: API requests in the window", s.col.id, s.n, r), "\n  "+text)
				writes := verbs["CREATE"] + verbs["UPDATE"] + verbs["PATCH"] + verbs["DELETE"]
				total := verbs["GET"] + verbs["LIST"] + verbs["WATCH"] + writes
				perMin := func(v int) float64 { return float64(v) / minutes }
				analytic, _ := analyticPerPodMin(s.col)
				figs[i] = []figure{
					{name: "CPU (ms per minute; schedstat ns)", key: "steady_cpu_ms_per_min", value: ms(cpu) / minutes},
					{name: "CPU per volume (µs per minute)", key: "steady_cpu_us_per_volume_min", value: float64(cpu.Microseconds()) / minutes / float64(s.n)},
					{name: "  the same in 10 ms ticks of /proc/<pid>/stat (ms per minute)", key: "steady_cpu_ticks_ms_per_min", value: ms(ticks) / minutes},
					{name: "API requests per minute", key: "steady_api_per_min", value: perMin(total)},
					{name: "  GETs per minute", key: "steady_get_per_min", value: perMin(verbs["GET"])},
					{name: "  LISTs per minute", key: "steady_list_per_min", value: perMin(verbs["LIST"])},
					{name: "  WATCHes opened per minute", key: "steady_watch_per_min", value: perMin(verbs["WATCH"])},
					{name: "  writes per minute", key: "steady_writes_per_min", value: perMin(writes)},
					{name: "API requests per pod per minute", key: "steady_api_per_pod_min", value: perMin(total) / float64(s.n)},
					{name: "  GETs per pod per minute", key: "steady_get_per_pod_min", value: perMin(verbs["GET"]) / float64(s.n)},
					{name: "  analytic, per pod per minute, from the agent's periods (notes)", key: "steady_analytic_per_pod_min", value: analytic},
					{name: "watches open, most in the window", key: "steady_watches_open", value: float64(maxOpen)},
				}
			}
			for i, s := range order {
				rss, heap, ok := agentMemory(ctx, b, s.a)
				figs[i] = append(figs[i],
					figure{name: "RSS after the window (MiB)", key: "steady_rss_mib", value: rss / (1 << 20)},
					figure{name: "Go heap in use then, after a GC (MiB)", key: "steady_heap_mib", value: heap / (1 << 20), missing: !ok})
			}
			deleted := time.Now()
			for _, s := range order {
				s.w.deleteAllPods(ctx, b)
			}
			for i, s := range order {
				teardown, done := s.w.waitTeardown(ctx, b, s.a, s.n, deleted, teardownCutoff)
				figs[i] = append(figs[i], figure{name: "teardown, all pods of every agent deleted at once (s)", key: "steady_teardown_s",
					value: teardown.Seconds(), missing: !done, note: fmt.Sprintf("did not finish in %v", teardownCutoff)})
				if err := s.a.stop(b, s.w); err != nil {
					b.Fatalf("stopping %s: %v", s.col.id, err)
				}
				book.add(section(s.n), s.n, s.col, r, i, figs[i])
			}
		}
		for _, n := range counts {
			printTable(b, section(n))
		}
	}
}

// schedCPU is the agent's CPU time so far in ns: the sum of the first
// field of /proc/<pid>/task/<tid>/schedstat (time on the CPU) over its
// threads. A thread that exited is no longer counted (Go's runtime keeps
// its threads; the 10 ms ticks of /proc/<pid>/stat count them all and are
// reported beside it).
func schedCPU(b *testing.B, a *agent) time.Duration {
	b.Helper()
	dir := fmt.Sprintf("/proc/%d/task", a.proc.pid())
	tasks, err := os.ReadDir(dir)
	if err != nil {
		b.Fatalf("%s: %v", a.col.id, err)
	}
	var sum time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // exited meanwhile
		}
		f := strings.Fields(string(data))
		if len(f) < 1 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			b.Fatalf("%s schedstat: %v", a.col.id, err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// sleepCtx sleeps d unless ctx ends first.
func sleepCtx(ctx context.Context, b *testing.B, d time.Duration) {
	b.Helper()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
}
