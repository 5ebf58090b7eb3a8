package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	// EnvPods names an environment variable with the comma-separated pod
	// counts of BenchmarkKubeletBaseline (default 30,110).
	EnvPods = "KUBELET_BENCH_PODS"
	// EnvIdle names an environment variable with the idle window of
	// BenchmarkKubeletBaseline and the settle time of BenchmarkAPICost, as
	// a Go duration (default 10s; the idle cost over a window long enough
	// for both agents' periods is BenchmarkSteadyState's).
	EnvIdle = "KUBELET_BENCH_IDLE"

	// serialInterval is the least time between two pods of the serial
	// phase, as in test/bench: 10 pods a second stay inside either agent's
	// default client budget (50 QPS), so that the phase measures the
	// agent's own work, not its client's token bucket.
	serialInterval = 100 * time.Millisecond
	// idleSettle is how long the agent is left alone after the last pod
	// was published before the idle window begins.
	idleSettle = 5 * time.Second
)

// BenchmarkKubeletBaseline runs the real kubelet's volume manager
// (kubelet-volumes) and csi-volmgr's agent binary one after the other on
// the same objects, for each pod count N of EnvPods, and prints both and
// their ratio:
//
//   - added latency, pod ADD → volumes published, zero-delay plugin: N pods,
//     each with its own PVC and PV (bound before; attachRequired=false),
//     created one after another, each once the previous one's
//     NodePublishVolume returned and at least serialInterval after it. The
//     clock starts just before the benchmark sends the pod's Create; the
//     plugin's journal gives when NodeStageVolume and NodePublishVolume
//     began and returned. published = publish returned − create sent;
//     added = published − the time spent inside the plugin's stage and
//     publish. Both agents are observed the same way, through the
//     plugin's journal, which costs neither of them anything. The pods
//     stay until the end of the scenario, so pod k meets k−1 running ones.
//
//   - each agent's own "ready" signal, first seen → ready, mean: the
//     kubelet's is WaitForAttachAndMount returning (it polls every 300 ms),
//     read from kubelet-volumes' pod records; csi-volmgr's is its
//     csi_volmgr_pod_volumes_ready_seconds histogram.
//
//   - CPU of the agent process per pod published (serial phase).
//
//   - idle: with the N volumes published and nothing changing, the agent
//     process's CPU time over EnvIdle (after idleSettle), per minute; its
//     RSS and Go heap in use after it.
//
//   - teardown: all N pods deleted at once → every volume unstaged and
//     nothing mounted below the agent's root directory.
//
//     make bench-kubelet   (or, in test/kubelet: go test -run='^$' -bench=KubeletBaseline -benchtime=1x ./bench/)
func BenchmarkKubeletBaseline(b *testing.B) {
	counts := podCounts(b)
	idle := idleWindow(b)
	book.setting("serial pods", counts)
	book.setting("serial idle before memory", idle)
	w := newWorld(b.Context(), b, worldOptions{driver: "baseline.kubelet-bench.csi-volmgr.io", volumes: slices.Max(counts)})
	for _, n := range counts {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			for range b.N {
				sideBySide(b.Context(), b, w, serialScenario(n, idle))
			}
		})
	}
}

// serialScenario is the serial latency, own-ready, CPU, idle and teardown
// rows for n pods.
func serialScenario(n int, idle time.Duration) scenario {
	return scenario{
		name: fmt.Sprintf("%d pods created one after another, zero-delay plugin", n),
		pods: n,
		run: func(ctx context.Context, b *testing.B, w *world, a *agent) []figure {
			cpu0 := agentCPU(b, a)
			began := time.Now()
			samples := w.createSerially(ctx, b, a, n)
			cpuSerial := agentCPU(b, a) - cpu0
			b.Logf("%s: %d pods published one after another in %v", a.kind.name, n, time.Since(began).Round(time.Millisecond))

			var published, added, toStage, between, pluginT, rtt []time.Duration
			for _, s := range samples {
				rtt = append(rtt, s.created.Sub(s.sent))
				published = append(published, s.publishEnd.Sub(s.sent))
				added = append(added, s.publishEnd.Sub(s.sent)-s.plugin)
				toStage = append(toStage, s.stageBegin.Sub(s.sent))
				between = append(between, s.publishBegin.Sub(s.stageEnd))
				pluginT = append(pluginT, s.plugin)
			}
			pub, add := newDist(published), newDist(added)
			figs := []figure{
				{name: "published p50 (ms)", key: "published_p50_ms", value: ms(pub.q(.5))},
				{name: "published p99 (ms)", key: "published_p99_ms", value: ms(pub.q(.99))},
				{name: "added p50 (ms)", key: "added_p50_ms", value: ms(add.q(.5))},
				{name: "added p99 (ms)", key: "added_p99_ms", value: ms(add.q(.99))},
				{name: "  create sent → stage begins p50 (ms)", key: "to_stage_p50_ms", value: ms(newDist(toStage).q(.5))},
				{name: "  stage returned → publish begins p50 (ms)", key: "stage_to_publish_p50_ms", value: ms(newDist(between).q(.5))},
				{name: "  inside the plugin p50 (ms)", key: "plugin_p50_ms", value: ms(newDist(pluginT).q(.5))},
				{name: "  floor: the Create round trip p50 (ms)", key: "create_rtt_p50_ms", value: ms(newDist(rtt).q(.5))},
				ownReady(ctx, b, a, samples),
				{name: "agent CPU per pod published (ms, 10 ms ticks)", key: "cpu_per_pod_ms", value: ms(cpuSerial) / float64(n)},
			}
			idleFigs := measureIdle(ctx, b, a, idle)
			figs = append(figs, idleFigs...)
			teardown := w.deletePods(ctx, b, a, n)
			return append(figs, figure{name: "teardown, all pods deleted at once (s)", key: "teardown_s", value: teardown.Seconds()})
		},
	}
}

// podSample is one pod of the serial phase, on the host's clock.
type podSample struct {
	uid types.UID
	// sent is just before the Create request was sent; created when its
	// answer arrived.
	sent, created time.Time
	// The plugin's first stage call and the publish call that returned
	// OK, and the time spent inside every stage and publish call of the
	// pod's volume meanwhile.
	stageBegin, stageEnd, publishBegin, publishEnd time.Time
	plugin                                         time.Duration
}

// createSerially creates n pods, pod i on volume i, each once the previous
// one's NodePublishVolume returned OK and at least serialInterval after
// the previous one was created.
func (w *world) createSerially(ctx context.Context, b *testing.B, a *agent, n int) []podSample {
	b.Helper()
	pods := w.creator.CoreV1().Pods(w.fx.Namespace)
	samples := make([]podSample, 0, n)
	var next time.Time
	for i, v := range w.volumes[:n] {
		select {
		case <-time.After(time.Until(next)):
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
		next = time.Now().Add(serialInterval)
		s := podSample{sent: time.Now()}
		p, err := pods.Create(ctx, newPod(fmt.Sprintf("%s-%d-%05d", a.tag, n, i), w.fx.NodeName, v.claim), metav1.CreateOptions{})
		if err != nil {
			b.Fatalf("creating pod %d: %v", i, err)
		}
		s.uid, s.created = p.UID, time.Now()
		deadline := s.sent.Add(runTimeout)
		for {
			if _, err := w.journal.poll(); err != nil {
				b.Fatal(err)
			}
			if w.journal.lastOK(v.handle, "NodePublishVolume", s.sent) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: pod %d (volume %s) not published within %v", a.kind.name, i, v.handle, runTimeout)
			}
			time.Sleep(time.Millisecond)
		}
		for _, c := range w.journal.calls(v.handle, s.sent, "NodeStageVolume", "NodePublishVolume") {
			s.plugin += c.end.Sub(c.begin)
			switch c.method {
			case "NodeStageVolume":
				if s.stageBegin.IsZero() {
					s.stageBegin = c.begin
				}
				if c.ok() {
					s.stageEnd = c.end
				}
			case "NodePublishVolume":
				if c.ok() {
					s.publishBegin, s.publishEnd = c.begin, c.end
				}
			}
		}
		if s.stageBegin.IsZero() || s.stageEnd.IsZero() {
			b.Fatalf("%s: pod %d (volume %s) published without a successful NodeStageVolume", a.kind.name, i, v.handle)
		}
		samples = append(samples, s)
	}
	return samples
}

// ownReady is the agent's own "pod's volumes ready" signal, first seen →
// ready, mean over the scenario's pods. It waits until the agent signalled
// every pod: the kubelet's WaitForAttachAndMount polls every 300 ms, so
// its signal may come after the publish.
func ownReady(ctx context.Context, b *testing.B, a *agent, samples []podSample) figure {
	b.Helper()
	f := figure{name: "own ready signal, seen → ready, mean (ms)", key: "own_ready_mean_ms"}
	want := map[types.UID]bool{}
	for _, s := range samples {
		want[s.uid] = true
	}
	waitFor(ctx, b, 100*time.Millisecond, time.Minute, a.kind.name+" signalled every pod ready", func() (bool, error) {
		if a.kind.readyMetric != "" {
			m, err := a.proc.metrics(ctx, a.kind.readyMetric)
			if err != nil {
				return false, err
			}
			count := m[a.kind.readyMetric+"_count"]
			if count > float64(len(samples)) {
				return false, fmt.Errorf("%s counts %v pods, want %d", a.kind.readyMetric, count, len(samples))
			}
			f.value = m[a.kind.readyMetric+"_sum"] / count * 1e3
			return count == float64(len(samples)), nil
		}
		// kubelet-volumes: its pod workers' records.
		code, body, err := a.proc.get(ctx, "/api/v1/pods")
		if err != nil || code != http.StatusOK {
			return false, fmt.Errorf("/api/v1/pods: %d %w", code, err)
		}
		var records []struct {
			UID   types.UID `json:"uid"`
			Added time.Time `json:"added"`
			Ready time.Time `json:"ready"`
		}
		if err := json.Unmarshal(body, &records); err != nil {
			return false, fmt.Errorf("decoding /api/v1/pods: %w", err)
		}
		var ready []time.Duration
		for _, r := range records {
			if want[r.UID] && !r.Ready.IsZero() {
				ready = append(ready, r.Ready.Sub(r.Added))
			}
		}
		f.value = ms(newDist(ready).mean())
		return len(ready) == len(samples), nil
	})
	return f
}

// measureIdle leaves the agent alone for idleSettle and then measures its
// CPU time over window, and its RSS and heap after it.
func measureIdle(ctx context.Context, b *testing.B, a *agent, window time.Duration) []figure {
	b.Helper()
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	cpu0, t0 := agentCPU(b, a), time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	cpu := agentCPU(b, a) - cpu0
	perMin := cpu.Seconds() / time.Since(t0).Minutes()
	rss, heap, ok := agentMemory(ctx, b, a)
	return []figure{
		{name: fmt.Sprintf("idle CPU (s per min, over %v)", window), key: "idle_cpu_s_per_min", value: perMin},
		{name: "idle CPU (% of one core)", key: "idle_cpu_pct", value: perMin / 60 * 100},
		{name: "RSS after the idle window (MiB)", key: "rss_mib", value: rss / (1 << 20)},
		{name: "Go heap in use then, after a GC (MiB)", key: "heap_mib", value: heap / (1 << 20), missing: !ok},
	}
}

// agentMemory is the agent's RSS and its Go heap in use right after a
// garbage collection (both agents serve /debug/pprof/, whose heap profile
// with gc=1 runs one), in bytes.
func agentMemory(ctx context.Context, b *testing.B, a *agent) (rss, heap float64, ok bool) {
	b.Helper()
	code, profile, err := a.proc.get(ctx, "/debug/pprof/heap?gc=1")
	if err != nil || code != http.StatusOK {
		b.Fatalf("%s: forcing a GC through /debug/pprof/heap?gc=1: %d %v", a.kind.name, code, err)
	}
	// Kept for `go tool pprof`: where the heap goes.
	dir := filepath.Join(resultsDir(), "profiles")
	if err := os.MkdirAll(dir, 0o755); err == nil {
		name := strings.NewReplacer("/", "_", "=", "").Replace(b.Name())
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-heap.pb.gz", name, a.tag)), profile, 0o644)
	}
	r, err := a.proc.rss()
	if err != nil {
		b.Fatal(err)
	}
	m, err := a.proc.metrics(ctx, a.kind.heapMetric)
	if err != nil {
		b.Fatalf("%s metrics: %v", a.kind.name, err)
	}
	heap, ok = m[a.kind.heapMetric]
	return float64(r), heap, ok
}

func agentCPU(b *testing.B, a *agent) time.Duration {
	b.Helper()
	cpu, err := a.proc.cpu()
	if err != nil {
		b.Fatalf("%s CPU time: %v", a.kind.name, err)
	}
	return cpu
}

// podCounts parses EnvPods.
func podCounts(b testing.TB) []int {
	b.Helper()
	s := os.Getenv(EnvPods)
	if s == "" {
		return []int{30, 110}
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want comma-separated pod counts ≥ 1", EnvPods, s)
		}
		out = append(out, n)
	}
	return out
}

// idleWindow parses EnvIdle.
func idleWindow(b testing.TB) time.Duration {
	b.Helper()
	s := os.Getenv(EnvIdle)
	if s == "" {
		return 10 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		b.Fatalf("%s=%q: want a positive duration", EnvIdle, s)
	}
	return d
}
