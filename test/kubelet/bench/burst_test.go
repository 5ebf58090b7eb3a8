package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// EnvBurst names an environment variable with the comma-separated pod
	// counts of BenchmarkBurst (default 0,110,1000: the kubelet's max-pods
	// and the stress row; make bench-kubelet-stress runs
	// 0,3000,5000,10000; 0 is the agent with nothing to do, the baseline of
	// the memory per volume).
	EnvBurst = "KUBELET_BENCH_BURST"
	// EnvCutoff names an environment variable with how long BenchmarkBurst
	// waits for a burst (and for its teardown) before it reports "did not
	// finish" (default 10m).
	EnvCutoff = "KUBELET_BENCH_CUTOFF"
	// EnvTeardownCutoff names an environment variable with how long
	// BenchmarkBurst waits for a teardown before it reports "did not
	// finish" and cleans up through the plugin (default 5m).
	EnvTeardownCutoff = "KUBELET_BENCH_TEARDOWN_CUTOFF"
	// EnvRestartAt names an environment variable with the burst size after
	// which each agent is restarted (default 5000, a stress row; 0: never).
	EnvRestartAt = "KUBELET_BENCH_RESTART_AT"
	// EnvBurstIdle names an environment variable with the idle window
	// after each burst, after which the memory is read (default 10s; the
	// idle cost is BenchmarkSteadyState's).
	EnvBurstIdle = "KUBELET_BENCH_BURST_IDLE"

	// burstCreators is how many goroutines create the pods of a burst.
	burstCreators = 32
)

// baselines holds each column's memory with no pod (the burst of 0, its
// last run), the baseline of the memory per volume.
var baselines = struct {
	sync.Mutex
	rss, heap map[string]float64
}{rss: map[string]float64{}, heap: map[string]float64{}}

// BenchmarkBurst binds N pods to the node at once (created by 32
// goroutines as fast as the API server takes them), each with its own PVC
// and PV, zero-delay plugin, for each N of EnvBurst, and prints for both
// agents:
//
//   - burst: time from the first Create sent until every pod's volume was
//     published, p50 and p99 of create sent → published per pod, or "did
//     not finish" with how many were published when the cutoff (EnvCutoff)
//     ended the wait; the agent's CPU time meanwhile;
//
//   - steady state, N volumes published: idle CPU (s per minute, over
//     EnvBurstIdle), RSS and Go heap after a GC, and per volume above the
//     agent with no pod (N = 0, the first count);
//
//   - at N = EnvRestartAt: the agent stopped (SIGTERM) and started again
//     on the same root directory: time until it is ready and until every
//     pod's volumes are ready again by its own signal, and the stage and
//     publish calls the restart made;
//
//   - teardown: all N pods deleted at once → everything unstaged and
//     unmounted (or "did not finish" within EnvTeardownCutoff; the
//     harness then unmounts what the
//     agent left, through the plugin, so that the next agent starts
//     clean).
//
//     make bench-kubelet   (or: go test -run='^$' -bench=Burst -benchtime=1x ./bench/)
func BenchmarkBurst(b *testing.B) {
	counts := intList(b, EnvBurst, []int{0, 110, 1000})
	cutoff := durationEnv(b, EnvCutoff, 10*time.Minute)
	teardownCutoff := durationEnv(b, EnvTeardownCutoff, 5*time.Minute)
	idle := durationEnv(b, EnvBurstIdle, 10*time.Second)
	restartAt := intList(b, EnvRestartAt, []int{5000})[0]
	book.setting("burst pods", counts)
	book.setting("burst idle before memory", idle)
	book.setting("restart at", restartAt)
	w := newWorld(b.Context(), b, worldOptions{driver: "burst.kubelet-bench.csi-volmgr.io", volumes: max(slices.Max(counts), 1)})
	for _, n := range counts {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			for range b.N {
				sideBySide(b.Context(), b, w, burstScenario(n, cutoff, teardownCutoff, idle, n == restartAt))
			}
		})
	}
}

func burstScenario(n int, cutoff, teardownCutoff, idle time.Duration, restart bool) scenario {
	return scenario{
		name: fmt.Sprintf("burst: %d pods bound at once, zero-delay plugin", n),
		pods: n,
		run: func(ctx context.Context, b *testing.B, w *world, a *agent) []figure {
			if n == 0 {
				figs := measureIdle(ctx, b, a, idle)
				baselines.Lock()
				baselines.rss[a.col.id] = figs[2].value
				baselines.heap[a.col.id] = figs[3].value
				baselines.Unlock()
				return figs
			}
			cpu0 := agentCPU(b, a)
			began := time.Now()
			sent, created := w.createBurst(ctx, b, a, n)
			ends, finished := w.waitBurst(ctx, b, sent, cutoff)
			cpuBurst := agentCPU(b, a) - cpu0
			var lat []time.Duration
			last := began
			for i, end := range ends {
				if !end.IsZero() {
					lat = append(lat, end.Sub(sent[i]))
					if end.After(last) {
						last = end
					}
				}
			}
			d := newDist(lat)
			notDone := fmt.Sprintf("did not finish (%d/%d in %v)", len(lat), n, cutoff)
			figs := []figure{
				{name: "creates sent, first → last (s)", key: "burst_create_s", value: created.Seconds()},
				{name: "all published, first create → last publish (s)", key: "burst_all_s", value: last.Sub(began).Seconds(), missing: !finished, note: notDone},
				{name: "per pod, create sent → published, p50 (s)", key: "burst_p50_s", value: d.q(.5).Seconds(), missing: !finished, note: notDone},
				{name: "per pod, create sent → published, p99 (s)", key: "burst_p99_s", value: d.q(.99).Seconds(), missing: !finished, note: notDone},
				{name: "agent CPU during the burst (s)", key: "burst_cpu_s", value: cpuBurst.Seconds()},
			}
			b.Logf("%s: burst of %d: %d published, all by %v", a.kind.name, n, len(lat), last.Sub(began).Round(time.Millisecond))
			if !finished {
				teardown, done := w.deletePodsWithin(ctx, b, a, n, teardownCutoff)
				return append(figs, figure{name: "teardown, all pods deleted at once (s)", key: "teardown_s",
					value: teardown.Seconds(), missing: !done, note: fmt.Sprintf("did not finish in %v", teardownCutoff)})
			}
			idleFigs := measureIdle(ctx, b, a, idle)
			figs = append(figs, idleFigs...)
			baselines.Lock()
			rss0, okR := baselines.rss[a.col.id]
			heap0, okH := baselines.heap[a.col.id]
			baselines.Unlock()
			figs = append(figs,
				figure{name: "RSS per volume above N = 0 (KiB)", key: "rss_per_volume_kib",
					value: (idleFigs[2].value - rss0) * 1024 / float64(n), missing: !okR, note: "no N = 0 run"},
				figure{name: "heap per volume above N = 0 (KiB)", key: "heap_per_volume_kib",
					value: (idleFigs[3].value - heap0) * 1024 / float64(n), missing: !okH || idleFigs[3].missing, note: "no N = 0 run"})
			if restart {
				figs = append(figs, w.measureRestart(ctx, b, a, n)...)
			}
			teardown, done := w.deletePodsWithin(ctx, b, a, n, teardownCutoff)
			return append(figs, figure{name: "teardown, all pods deleted at once (s)", key: "teardown_s",
				value: teardown.Seconds(), missing: !done, note: fmt.Sprintf("did not finish in %v", teardownCutoff)})
		},
	}
}

// createBurst creates pods 0..n-1 of the world's volumes from
// burstCreators goroutines and returns when each Create was sent, and how
// long the creates took from the first to the last.
func (w *world) createBurst(ctx context.Context, b *testing.B, a *agent, n int) ([]time.Time, time.Duration) {
	b.Helper()
	pods := w.creator.CoreV1().Pods(w.fx.Namespace)
	sent := make([]time.Time, n)
	began := time.Now()
	parallelN(b, burstCreators, n, func(i int) error {
		sent[i] = time.Now()
		_, err := pods.Create(ctx, newPod(fmt.Sprintf("%s-b%d-%05d", a.tag, n, i), w.fx.NodeName, w.volumes[i].claim), metav1.CreateOptions{})
		return err
	})
	return sent, time.Since(began)
}

// waitBurst waits until the first len(sent) volumes were published (a
// NodePublishVolume that began after the pod's create was sent returned
// OK), or cutoff passed since the first create. It returns when each was
// published (zero: not within the cutoff) and whether all were.
func (w *world) waitBurst(ctx context.Context, b *testing.B, sent []time.Time, cutoff time.Duration) ([]time.Time, bool) {
	b.Helper()
	ends := make([]time.Time, len(sent))
	left := len(sent)
	deadline := slices.MinFunc(sent, func(x, y time.Time) int { return x.Compare(y) }).Add(cutoff)
	for left > 0 && time.Now().Before(deadline) {
		if _, err := w.journal.poll(); err != nil {
			b.Fatal(err)
		}
		for i := range sent {
			if !ends[i].IsZero() {
				continue
			}
			for _, c := range w.journal.calls(w.volumes[i].handle, sent[i], "NodePublishVolume") {
				if c.ok() {
					ends[i] = c.end
					left--
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return ends, left == 0
}

// measureRestart stops the agent (SIGTERM) with n pods' volumes published
// and starts it again on the same root directory, and measures the time
// until it is ready, until every pod is ready by its own signal (or "not
// ready" after restartCutoff), and the CSI calls it made until then and
// for restartQuiet after.
func (w *world) measureRestart(ctx context.Context, b *testing.B, a *agent, n int) []figure {
	b.Helper()
	const (
		restartQuiet = 5 * time.Second
		// restartCutoff bounds the wait for every pod to be ready again;
		// the calls are counted until then.
		restartCutoff = 5 * time.Minute
	)
	since := time.Now()
	a.restart(ctx, b, w, false)
	ready := time.Since(since)
	var (
		all     time.Duration
		readyOf int
	)
	for time.Since(since) < restartCutoff {
		k, err := a.readyPods(ctx)
		if err != nil {
			b.Fatalf("%s after the restart: %v", a.kind.name, err)
		}
		all, readyOf = time.Since(since), k
		if k >= n {
			break
		}
		select {
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	time.Sleep(restartQuiet) // calls the agent makes right after it signalled ready count too
	if _, err := w.journal.poll(); err != nil {
		b.Fatal(err)
	}
	var stage, publish, other int
	for _, v := range w.volumes[:n] {
		for _, c := range w.journal.calls(v.handle, since, "NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume") {
			switch c.method {
			case "NodeStageVolume":
				stage++
			case "NodePublishVolume":
				publish++
			default:
				other++
			}
		}
	}
	if other > 0 {
		b.Errorf("%s restart: %d unpublish/unstage calls for pods that still run", a.kind.name, other)
	}
	return []figure{
		{name: fmt.Sprintf("restart (SIGTERM) with %d volumes: ready (s)", n), key: "restart_ready_s", value: ready.Seconds()},
		{name: "restart: every pod ready again, own signal (s)", key: "restart_pods_ready_s", value: all.Seconds(),
			missing: readyOf < n, note: fmt.Sprintf("%d/%d in %v", readyOf, n, restartCutoff)},
		{name: "restart: NodeStageVolume calls", key: "restart_stage_calls", value: float64(stage)},
		{name: "restart: NodePublishVolume calls", key: "restart_publish_calls", value: float64(publish)},
	}
}

// readyPods is how many pods the agent signalled ready since it started:
// csi-volmgr's pod-ready histogram count, or kubelet-volumes' pod
// records with Ready set.
func (a *agent) readyPods(ctx context.Context) (int, error) {
	if a.kind.readyMetric != "" {
		m, err := a.proc.metrics(ctx, a.kind.readyMetric)
		if err != nil {
			return 0, err
		}
		return int(m[a.kind.readyMetric+"_count"]), nil
	}
	code, body, err := a.proc.get(ctx, "/api/v1/pods")
	if err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("/api/v1/pods: %d %w", code, err)
	}
	var records []struct {
		Ready time.Time `json:"ready"`
	}
	if err := json.Unmarshal(body, &records); err != nil {
		return 0, err
	}
	k := 0
	for _, r := range records {
		if !r.Ready.IsZero() {
			k++
		}
	}
	return k, nil
}

// deletePodsWithin is deletePods with a cutoff: when the agent has not
// torn everything down by then, it is killed, what it left is unmounted
// through the plugin (janitor), and done is false.
func (w *world) deletePodsWithin(ctx context.Context, b *testing.B, a *agent, n int, cutoff time.Duration) (took time.Duration, done bool) {
	b.Helper()
	began := time.Now()
	w.deleteAllPods(ctx, b)
	return w.waitTeardown(ctx, b, a, n, began, cutoff)
}

// waitTeardown is the wait of deletePodsWithin for pods deleted at began.
func (w *world) waitTeardown(ctx context.Context, b *testing.B, a *agent, n int, began time.Time, cutoff time.Duration) (took time.Duration, done bool) {
	b.Helper()
	want := map[string]bool{}
	for _, v := range w.volumes[:n] {
		want[v.handle] = true
	}
	for time.Since(began) < cutoff {
		if _, err := w.journal.poll(); err != nil {
			b.Fatal(err)
		}
		for h := range want {
			if w.journal.lastOK(h, "NodeUnstageVolume", began) {
				delete(want, h)
			}
		}
		if len(want) == 0 && len(mountsBelow(b, a.root)) == 0 {
			return time.Since(began), true
		}
		select {
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	took = time.Since(began)
	b.Logf("%s: teardown of %d pods not done in %v (%d volumes still staged); cleaning up through the plugin", a.kind.name, n, cutoff, len(want))
	if err := a.proc.kill(); err != nil {
		b.Fatal(err)
	}
	w.janitor(ctx, b, a)
	waitFor(ctx, b, 100*time.Millisecond, time.Minute, "the pods to be gone", func() (bool, error) {
		l, err := w.creator.CoreV1().Pods(w.fx.Namespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
	return took, false
}

// parallelN is parallel with k goroutines.
func parallelN(tb testing.TB, k, n int, fn func(i int) error) {
	tb.Helper()
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	for range k {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= n || first != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		tb.Fatal(first)
	}
}

// intList parses a comma-separated list of counts ≥ 0 from env, or def.
func intList(tb testing.TB, env string, def []int) []int {
	tb.Helper()
	s := os.Getenv(env)
	if s == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			tb.Fatalf("%s=%q: want comma-separated counts ≥ 0", env, s)
		}
		out = append(out, n)
	}
	return out
}

// durationEnv parses a positive Go duration from env, or def.
func durationEnv(tb testing.TB, env string, def time.Duration) time.Duration {
	tb.Helper()
	s := os.Getenv(env)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		tb.Fatalf("%s=%q: want a positive duration", env, s)
	}
	return d
}
