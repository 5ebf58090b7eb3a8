package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	// EnvWatches names an environment variable with how many by-name
	// watches BenchmarkWatchCost opens (default 10000).
	EnvWatches = "KUBELET_BENCH_WATCHES"
	// watchWindow is each idle window on the API server.
	watchWindow = 30 * time.Second
	// watchWrites and watchGets are how many PVC updates and GETs the
	// API server's CPU per request is measured over.
	watchWrites = 1000
	watchGets   = 3000

	// The cluster the figures are extrapolated to.
	clusterNodes = 5000
	podsPerNode  = 110
)

// apiserverFigures is what BenchmarkWatchCost reads from kube-apiserver.
type apiserverFigures struct {
	heap, rss, goroutines float64
	cpuPerMin             float64
}

// BenchmarkWatchCost measures what by-name watches cost kube-apiserver,
// the price of csi-volmgr's by-name sources at cluster scale: with
// EnvWatches PVCs, it opens one watch per PVC as the agent's reflectors do
// (field selector metadata.name, bookmarks, a 30-minute timeout) from this
// process, and reads the API server's heap after a GC, RSS, goroutines and
// idle CPU before and after, its CPU per PVC update with and without the
// watches (each update is matched against every watcher of the kind), and
// its CPU per GET. It then extrapolates to clusterNodes × podsPerNode pods,
// one PVC and one PV per pod: the agents' watches, against the kubelet's
// pattern of GETs (its requests per pod and per minute as BenchmarkAPICost
// measured them in this run, else 2 GETs per pod and per minute).
//
//	make bench-kubelet   (or: go test -run='^$' -bench=WatchCost -benchtime=1x ./bench/)
func BenchmarkWatchCost(b *testing.B) {
	n := intList(b, EnvWatches, []int{10000})[0]
	fx := k8stest.New(b)
	ctx := b.Context()
	client := fastClient(b, fx.Config)
	pid := apiserverPID(b)
	pvcs := client.CoreV1().PersistentVolumeClaims(fx.Namespace)
	size := resource.MustParse("1Mi")
	began := time.Now()
	parallelN(b, burstCreators, n, func(i int) error {
		_, err := pvcs.Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w-%05d", i)},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		}, metav1.CreateOptions{})
		return err
	})
	b.Cleanup(func() {
		_ = pvcs.DeleteCollection(context.WithoutCancel(ctx), metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	b.Logf("%d PVCs created in %v", n, time.Since(began).Round(time.Millisecond))
	for range b.N {
		// Benchmarks before this one leave kube-apiserver freeing what
		// they created (the steady state's thousands of objects): its
		// heap must have settled before it is the baseline.
		settleAPIServerHeap(ctx, b, client)
		// The writes first: what they leave in the API server (its watch
		// cache's history) is then in the baseline.
		writesWithout := cpuPer(b, pid, watchWrites, func(i int) error { return touch(ctx, client, fx.Namespace, i%n) })
		before := readAPIServer(ctx, b, client, pid)

		list, err := pvcs.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			b.Fatal(err)
		}
		watchCtx, stopWatches := context.WithCancel(ctx)
		var wg sync.WaitGroup
		began := time.Now()
		parallelN(b, burstCreators, n, func(i int) error {
			wi, err := pvcs.Watch(watchCtx, metav1.ListOptions{
				FieldSelector:       fields.OneTermEqualSelector("metadata.name", fmt.Sprintf("w-%05d", i)).String(),
				ResourceVersion:     list.ResourceVersion,
				AllowWatchBookmarks: true,
				TimeoutSeconds:      ptr.To[int64](1800),
			})
			if err != nil {
				return err
			}
			wg.Go(func() { drain(watchCtx, wi) })
			return nil
		})
		opened := time.Since(began)
		time.Sleep(5 * time.Second)
		with := readAPIServer(ctx, b, client, pid)
		writesWith := cpuPer(b, pid, watchWrites, func(i int) error { return touch(ctx, client, fx.Namespace, i%n) })
		stopWatches()
		wg.Wait()
		time.Sleep(5 * time.Second)
		after := readAPIServer(ctx, b, client, pid)
		gets := cpuPer(b, pid, watchGets, func(i int) error {
			_, err := pvcs.Get(ctx, fmt.Sprintf("w-%05d", i%n), metav1.GetOptions{})
			return err
		})

		// The reading after the watches closed is shown, not used: the
		// writes made while they were open stay in the API server. A
		// per-watch heap that is not positive is no measurement: its
		// figures are missing.
		perWatchHeap := (with.heap - before.heap) / float64(n)
		heapMissing := perWatchHeap <= 0
		heapNote := fmt.Sprintf("not measured: the API server's heap went %.0f → %.0f → %.0f MiB (before, with the watches, after)",
			before.heap/(1<<20), with.heap/(1<<20), after.heap/(1<<20))
		perWatchRSS := (with.rss - before.rss) / float64(n)
		perWatchGoroutines := (with.goroutines - before.goroutines) / float64(n)
		perWatchCPU := (with.cpuPerMin - before.cpuPerMin) / float64(n) // s per minute
		fanout := writesWith - writesWithout                            // CPU s per write, n watchers
		details(b, fmt.Sprintf("kube-apiserver with %d by-name PVC watches (opened in %v; load %s)", n, opened.Round(time.Millisecond), loadAverage()),
			fmt.Sprintf("\n  heap after GC: %.1f → %.1f → %.1f MiB after the watches closed (%.2f KiB per watch)"+
				"\n  RSS: %.1f → %.1f MiB (%.2f KiB per watch)"+
				"\n  goroutines: %.0f → %.0f (%.2f per watch)"+
				"\n  idle CPU: %.3f → %.3f s per minute (%.2g s per minute per watch)"+
				"\n  CPU per PVC update: %.3f ms without the watches, %.3f ms with them (+%.3f ms: %.3g µs per watcher)"+
				"\n  CPU per GET: %.3f ms",
				before.heap/(1<<20), with.heap/(1<<20), after.heap/(1<<20), perWatchHeap/1024,
				before.rss/(1<<20), with.rss/(1<<20), perWatchRSS/1024,
				before.goroutines, with.goroutines, perWatchGoroutines,
				before.cpuPerMin, with.cpuPerMin, perWatchCPU,
				writesWithout*1e3, writesWith*1e3, fanout*1e3, fanout*1e6/float64(n),
				gets*1e3))

		// The cluster: one PVC and one PV per pod.
		pods := float64(clusterNodes * podsPerNode)
		watches := 2 * pods
		getsPerPod, ok1 := book.value("api_pod_get", true)
		getsPerPodMin, ok2 := book.value("steady_get_per_pod_min", true)
		source := "as BenchmarkAPICost (per pod start) and BenchmarkSteadyState (per minute) measured the kubelet in this run"
		if !ok1 || !ok2 {
			analytic, _ := analyticPerPodMin(colKubelet)
			getsPerPod, getsPerPodMin, source = 4, analytic, "not measured in this run: 4 per pod start, and the analytic figure per minute"
		}
		kubeletGetsPerSec := pods * getsPerPodMin / 60
		kubeletCPU := kubeletGetsPerSec * gets // cores
		watchMemGiB := watches * perWatchHeap / (1 << 30)
		watchRSSGiB := watches * perWatchRSS / (1 << 30)
		watchCPU := watches * perWatchCPU / 60 // cores
		// A write to a PVC or PV is matched against every watcher of its
		// kind: at cluster scale, pods watchers instead of n.
		fanoutPerWrite := fanout / float64(n) * pods
		book.note("watch cost: kube-apiserver per by-name watch (%d open): heap %.2f KiB, RSS %.2f KiB, %.2f goroutines, idle CPU %.2g s/min; "+
			"CPU per PVC update +%.3f ms with the %d watches (%.3g µs per watcher); CPU per GET %.3f ms",
			n, perWatchHeap/1024, perWatchRSS/1024, perWatchGoroutines, perWatchCPU, fanout*1e3, n, fanout*1e6/float64(n), gets*1e3)
		book.note("watch cost at %d nodes × %d pods (%.0f pods, %.0f by-name watches): API server heap %.1f GiB (RSS %.1f GiB), idle CPU %.2f cores, "+
			"+%.1f ms CPU per PVC/PV write; the kubelet's GETs (%.1f per pod start, %.2f per pod per minute, %s): %.0f GETs/s, %.2f cores, no standing memory",
			clusterNodes, podsPerNode, pods, watches, watchMemGiB, watchRSSGiB, watchCPU, fanoutPerWrite*1e3, getsPerPod, getsPerPodMin, source, kubeletGetsPerSec, kubeletCPU)
		details(b, fmt.Sprintf("extrapolated to %d nodes × %d pods", clusterNodes, podsPerNode), fmt.Sprintf(
			"\n  csi-volmgr, a by-name watch per PVC and PV: %.0f watches, %.1f GiB API server heap (%.1f GiB RSS), %.2f cores idle, +%.1f ms CPU per PVC/PV write"+
				"\n  the kubelet, GETs (%s): %.1f per pod start, %.2f per pod per minute: %.0f GETs/s, %.2f cores, no standing memory",
			watches, watchMemGiB, watchRSSGiB, watchCPU, fanoutPerWrite*1e3, source, getsPerPod, getsPerPodMin, kubeletGetsPerSec, kubeletCPU))
		// The same as rows: what each way of keeping up costs the API
		// server at that scale in steady state (one measurement,
		// extrapolated): the kubelet's GETs, csi-volmgr's default settled
		// re-reads (2 GETs per pod per period, no standing watch once
		// settled), csi-volmgr watching every referenced object.
		section := fmt.Sprintf("API server in steady state at %d nodes × %d pods, extrapolated from %d by-name watches and %d GETs measured here", clusterNodes, podsPerNode, n, watchGets)
		resyncPerPodMin, _ := analyticPerPodMin(colVolmgrDefaults)
		for i, c := range []struct {
			col         *column
			heap, cpu   float64
			heapMissing bool
		}{
			{colKubelet, 0, kubeletCPU, false},
			{colVolmgrDefaults, 0, pods * resyncPerPodMin / 60 * gets, false},
			{colVolmgrWatch, watchMemGiB, watchCPU, heapMissing},
		} {
			book.add(section, 0, c.col, 0, i, []figure{
				{name: "standing heap for the agents' watches (GiB)", key: "apiserver_heap_gib", value: c.heap, missing: c.heapMissing, note: heapNote},
				{name: "CPU for the agents' steady-state requests and watches (cores)", key: "apiserver_cpu_cores", value: c.cpu},
			})
		}
		b.ReportMetric(perWatchHeap/1024, "heap_kib_per_watch")
		b.ReportMetric(perWatchRSS/1024, "rss_kib_per_watch")
		b.ReportMetric(gets*1e3, "cpu_ms_per_get")
		b.ReportMetric(fanout*1e6/float64(n), "cpu_us_per_write_per_watcher")
	}
}

// drain reads a watch until ctx ends.
func drain(ctx context.Context, w watch.Interface) {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-w.ResultChan():
			if !ok {
				return
			}
		}
	}
}

// touch updates one of BenchmarkWatchCost's PVCs (a label), as a status
// or metadata change would.
func touch(ctx context.Context, client kubernetes.Interface, ns string, i int) error {
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"touched":"%d"}}}`, time.Now().UnixNano())
	_, err := client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, fmt.Sprintf("w-%05d", i), types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// cpuPer runs fn(0..k-1) on burstCreators goroutines and returns the API
// server's CPU time per call, in seconds.
func cpuPer(tb testing.TB, pid, k int, fn func(i int) error) float64 {
	tb.Helper()
	c0 := pidCPU(tb, pid)
	parallelN(tb, burstCreators/2, k, fn)
	return (pidCPU(tb, pid) - c0).Seconds() / float64(k)
}

// settleAPIServerHeap waits, at most heapSettleMax, until two readings of
// the API server's heap after a GC, heapSettleEvery apart, differ by less
// than 2 %.
func settleAPIServerHeap(ctx context.Context, tb testing.TB, client kubernetes.Interface) {
	tb.Helper()
	const heapSettleEvery, heapSettleMax = 10 * time.Second, 3 * time.Minute
	began := time.Now()
	heap := func() float64 { return apiserverGauges(ctx, tb, client)("go_memstats_heap_inuse_bytes") }
	last := heap()
	for time.Since(began) < heapSettleMax {
		time.Sleep(heapSettleEvery)
		now := heap()
		if math.Abs(now-last) < 0.02*last {
			tb.Logf("kube-apiserver's heap settled at %.0f MiB after %v", now/(1<<20), time.Since(began).Round(time.Second))
			return
		}
		last = now
	}
	tb.Logf("kube-apiserver's heap did not settle in %v (last %.0f MiB); measuring anyway", heapSettleMax, last/(1<<20))
}

// apiserverGauges forces a GC in the API server and returns a reader of
// its /metrics gauges.
func apiserverGauges(ctx context.Context, tb testing.TB, client kubernetes.Interface) func(name string) float64 {
	tb.Helper()
	rc := client.CoreV1().RESTClient()
	if err := rc.Get().AbsPath("/debug/pprof/heap").Param("gc", "1").Do(ctx).Error(); err != nil {
		tb.Fatalf("forcing a GC in kube-apiserver: %v", err)
	}
	body, err := rc.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		tb.Fatalf("kube-apiserver /metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		tb.Fatalf("parsing kube-apiserver /metrics: %v", err)
	}
	return func(name string) float64 {
		f, ok := families[name]
		if !ok || len(f.GetMetric()) == 0 {
			tb.Fatalf("kube-apiserver /metrics has no %s", name)
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
}

// readAPIServer reads the API server's heap after a GC, RSS, goroutines,
// and its CPU over watchWindow.
func readAPIServer(ctx context.Context, tb testing.TB, client kubernetes.Interface, pid int) apiserverFigures {
	tb.Helper()
	gauge := apiserverGauges(ctx, tb, client)
	var out apiserverFigures
	out.heap = gauge("go_memstats_heap_inuse_bytes")
	out.goroutines = gauge("go_goroutines")
	rss, err := pidRSS(pid)
	if err != nil {
		tb.Fatal(err)
	}
	out.rss = float64(rss)
	c0, t0 := pidCPU(tb, pid), time.Now()
	time.Sleep(watchWindow)
	out.cpuPerMin = (pidCPU(tb, pid) - c0).Seconds() / time.Since(t0).Minutes()
	return out
}

// apiserverPID finds the kube-apiserver that envtest started for this
// test binary: a child of this process.
func apiserverPID(tb testing.TB) int {
	tb.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != "kube-apiserver" {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(self) {
			return pid
		}
	}
	tb.Fatal("no kube-apiserver child of this process")
	return 0
}

// pidCPU is process pid's CPU time so far.
func pidCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	d, err := cpuOf(pid)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}
