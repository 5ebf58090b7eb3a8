package volumemanager_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/apibudget"
)

// floodBenchEnv runs TestFloodDoesNotSlowVolumes at full size (bursts of
// 30 pods, three of each kind, and the agent without its bounds beside
// it) and names the JSON file its figures are written to.
const floodBenchEnv = "FLOOD_BENCH_OUT"

// FloodResult is what TestFloodDoesNotSlowVolumes measured, the raw
// figures docs/performance.md is rendered from (TestFloodDocs).
type FloodResult struct {
	Commit  string `json:"commit"`
	Command string `json:"command"`
	Machine string `json:"machine"`
	Date    string `json:"date"`
	// LoadBefore and LoadAfter are /proc/loadavg's first three fields.
	LoadBefore string `json:"loadBefore"`
	LoadAfter  string `json:"loadAfter"`
	CPUs       int    `json:"cpus"`
	// Pods is the size of each burst; Bursts how many of each kind.
	Pods   int `json:"pods"`
	Bursts int `json:"bursts"`
	// Flooders send made-up tokens, FloodRate requests a second in all:
	// paced, because they run on the agent's own 2 CPUs, and above the
	// agent's default API budget (100 QPS), which is what a flood without
	// the bounds exhausts. IdleConns are held open (and opened again when
	// closed).
	Flooders  int         `json:"flooders"`
	FloodRate int         `json:"floodRate"`
	IdleConns int         `json:"idleConns"`
	Runs      []FloodMode `json:"runs"`
}

// FloodMode is one agent's figures: with its bounds, or without them (no
// AuthClient, no limit of failed authentications or connections: the agent
// before issue 33).
type FloodMode struct {
	Mode string `json:"mode"`
	// QuietSeconds and FloodSeconds are each burst's time, first create to
	// last volume published, without and with the flood.
	QuietSeconds []float64 `json:"quietSeconds"`
	FloodSeconds []float64 `json:"floodSeconds"`
	// Ratio is the median flood burst over the median quiet one.
	Ratio float64 `json:"ratio"`
	// HeapBeforeMiB and HeapAfterMiB are the test process's heap in use
	// (agent, API clients and flooders; after a GC) before the first burst
	// and after the last.
	HeapBeforeMiB float64 `json:"heapBeforeMiB"`
	HeapAfterMiB  float64 `json:"heapAfterMiB"`
	// FloodRequests are the flooders' requests, by answer ("401", "429",
	// "error": the connection refused or closed).
	FloodRequests map[string]int64 `json:"floodRequests"`
	// TokenReviews are the reviews the agent asked the API server for
	// while the flood ran, FloodWindowSeconds from its first start to the
	// end of the last burst.
	TokenReviews       int64     `json:"tokenReviews"`
	FloodWindowSeconds float64   `json:"floodWindowSeconds"`
	FloodStart         time.Time `json:"-"`
}

// TestFloodDoesNotSlowVolumes publishes bursts of pods on a real API
// server with the test plugin, without and with an unauthenticated client
// flooding the TCP endpoint with made-up bearer tokens and holding idle
// connections, and compares the bursts' times: with the agent's bounds
// (its reviews on a client and token bucket of their own, failed
// authentications limited per address, connections capped) the flood
// must not slow the volumes by more than half, and must not grow the heap
// without bound. With FLOOD_BENCH_OUT set it runs at full size, runs the
// agent without its bounds too (for comparison, not asserted), and writes
// the figures there; that run is meant without -race (see bound).
func TestFloodDoesNotSlowVolumes(t *testing.T) {
	out := os.Getenv(floodBenchEnv)
	// Three bursts of each kind, compared by their medians: one burst of
	// 20 pods takes a quarter of a second, which one stall of the shared
	// CPUs doubles.
	res := FloodResult{Pods: 20, Bursts: 3, Flooders: 4, FloodRate: 200, IdleConns: 100}
	modes := []string{"bounded"}
	res.LoadBefore, res.CPUs = loadAverage(), runtime.NumCPU()
	// A gross regression (the reviews back on the volumes' budget, no
	// failure limit) makes the flooded bursts about 2.7 times as long
	// (docs/performance.md); the short round in the suite runs with the
	// race detector, which makes serving the flood cost several times the
	// CPU on the 2 shared CPUs, so it is held to 2, the full size (run
	// without -race, as documented) to 1.5.
	bound := 2.0
	if out != "" {
		bound = 1.5
		res.Pods, res.Bursts, res.Flooders, res.FloodRate, res.IdleConns = 30, 3, 8, 400, 300
		modes = append(modes, "unbounded")
	}
	for _, mode := range modes {
		m := runFlood(t, mode, res)
		t.Logf("%s: quiet bursts %v s, flood bursts %v s, ratio %.2f; heap %.1f → %.1f MiB; flood answers %v; %d TokenReviews",
			mode, m.QuietSeconds, m.FloodSeconds, m.Ratio, m.HeapBeforeMiB, m.HeapAfterMiB, m.FloodRequests, m.TokenReviews)
		res.Runs = append(res.Runs, m)
		if mode != "bounded" {
			continue
		}
		if m.Ratio > bound {
			t.Errorf("bursts under the flood took %.2f times as long as without (medians %v vs %v s), want at most %.1f", m.Ratio, m.FloodSeconds, m.QuietSeconds, bound)
		}
		if grown := m.HeapAfterMiB - m.HeapBeforeMiB; grown > 64 {
			t.Errorf("the heap grew by %.1f MiB under the flood, want at most 64", grown)
		}
		// The failed authentications of the one flooding address: the
		// burst, then one a second.
		if limit := int64(apiauth.DefaultFailureBurst) + int64(apiauth.DefaultFailuresPerSecond*m.FloodWindowSeconds) + 2; m.TokenReviews > limit {
			t.Errorf("%d TokenReviews during the flood, want at most %d", m.TokenReviews, limit)
		}
	}
	if out == "" {
		return
	}
	res.LoadAfter = loadAverage()
	res.Commit, res.Date = os.Getenv("FLOOD_BENCH_COMMIT"), time.Now().UTC().Format(time.RFC3339)
	res.Machine = os.Getenv("FLOOD_BENCH_MACHINE")
	res.Command = floodCommand
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// floodCommand is how the committed figures were made.
const floodCommand = "FLOOD_BENCH_OUT=$PWD/docs/bench/flood-$(git rev-parse --short=12 HEAD).json FLOOD_BENCH_COMMIT=$(git rev-parse --short=12 HEAD) " +
	"FLOOD_BENCH_MACHINE=\"<the machine>\" KUBEBUILDER_ASSETS=$PWD/bin/k8s go test -count=1 -timeout 30m -run '^TestFloodDoesNotSlowVolumes$' -v ./volumemanager/  # as root (mounts)"

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// runFlood runs one agent (bounded: as csi-volmgr run builds it; unbounded:
// without AuthClient and without the failure and connection limits) and
// its bursts, quiet and flooded alternately.
func runFlood(t *testing.T, mode string, res FloodResult) FloodMode {
	f := k8stest.New(t)
	tcp := freeAddress(t)
	var reviews atomic.Int64
	counted := func(cfg *rest.Config) *rest.Config {
		cfg = rest.CopyConfig(cfg)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if strings.HasSuffix(r.URL.Path, "/tokenreviews") {
					reviews.Add(1)
				}
				return rt.RoundTrip(r)
			})
		})
		return cfg
	}
	// The clients of csi-volmgr run at its default budget (100/400).
	mainCfg := counted(f.Config)
	mainCfg.QPS, mainCfg.Burst = 100, 400
	reportCfg, authCfg := rest.CopyConfig(mainCfg), rest.CopyConfig(mainCfg)
	budget := apibudget.New(mainCfg.QPS, mainCfg.Burst)
	mainCfg.RateLimiter, reportCfg.RateLimiter = budget.Reads(), budget.Reports()
	newClient := func(cfg *rest.Config) kubernetes.Interface {
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var driver string
	n := startClusterNodeWith(t, f, clusterNodeOptions{
		PV: func(pv *corev1.PersistentVolume) { driver = pv.Spec.CSI.Driver },
		Configure: func(c *volumemanager.Config) {
			c.HTTPEndpoint = tcp
			c.KubeClient, c.ReportClient = newClient(mainCfg), newClient(reportCfg)
			if mode == "bounded" {
				c.AuthClient = newClient(authCfg)
				return
			}
			l := volumemanager.DefaultServerLimits(0)
			l.MaxConnections, l.MaxConnectionsPerSource = 0, 0
			l.Failures = apiauth.FailureLimits{PerSecond: 1e9, Burst: 1 << 30}
			volumemanager.SetServerLimits(c, l)
		},
	})
	// Every burst's claims and volumes exist before it starts.
	kinds := 2 * res.Bursts
	for i := range kinds * res.Pods {
		createBound(t, f, driver, createVolume(t, n.plugin), "c"+strconv.Itoa(i), "pv-"+f.Namespace+"-"+strconv.Itoa(i))
	}
	m := FloodMode{Mode: mode, HeapBeforeMiB: heapInUseMiB(), FloodRequests: map[string]int64{}}
	for b := range kinds {
		flood := b%2 == 1
		var stop func() map[string]int64
		before := reviews.Load()
		if flood {
			if m.FloodStart.IsZero() {
				m.FloodStart = time.Now()
			}
			stop = startFlood(t, tcp, res.Flooders, res.FloodRate, res.IdleConns)
			time.Sleep(time.Second) // the flood is at full strength
		}
		took := burst(t, f, n, b*res.Pods, res.Pods)
		if flood {
			m.TokenReviews += reviews.Load() - before
			for k, v := range stop() {
				m.FloodRequests[k] += v
			}
			m.FloodSeconds = append(m.FloodSeconds, took.Seconds())
		} else {
			m.QuietSeconds = append(m.QuietSeconds, took.Seconds())
		}
	}
	if mode == "bounded" {
		if got, want := refusedMetric(t, n.vm, "failed_authentications"), m.FloodRequests["429"]; int64(got) != want {
			t.Errorf("csi_volmgr_http_refused_total{reason=\"failed_authentications\"} = %v, want the %d answers 429", got, want)
		}
	}
	m.FloodWindowSeconds = time.Since(m.FloodStart).Seconds()
	m.HeapAfterMiB = heapInUseMiB()
	m.Ratio = median(m.FloodSeconds) / median(m.QuietSeconds)
	return m
}

// burst creates pods first..first+count-1, each with its claim, at once,
// and returns the time from the first create to the last volume
// published; then deletes them and waits for their volumes to go.
func burst(t *testing.T, f *k8stest.Fixture, n *clusterNode, first, count int) time.Duration {
	t.Helper()
	ctx := t.Context()
	pods := f.Client.CoreV1().Pods(f.Namespace)
	created := make([]*corev1.Pod, count)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, count)
	for i := range count {
		wg.Go(func() {
			pod, err := pods.Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p" + strconv.Itoa(first+i), Namespace: f.Namespace},
				Spec: corev1.PodSpec{NodeName: f.NodeName,
					Containers: []corev1.Container{{Name: "c", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/v"}}}},
					Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c" + strconv.Itoa(first+i)}}}}},
			}, metav1.CreateOptions{})
			if err == nil {
				created[i] = pod
				err = n.vm.WaitForAttachAndMount(ctx, pod)
			}
			errs <- err
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, pod := range created {
		if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, pod := range created {
		if err := n.vm.WaitForUnmount(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	return took
}

// startFlood floods tcp: flooders send made-up bearer tokens to the
// guarded API, rate a second in all, and idle connections are held open (opened
// again, after 100ms, when the agent closes them). stop ends it and returns
// the flooders' answers by status.
func startFlood(t *testing.T, tcp string, flooders, rate, idle int) (stop func() map[string]int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	answers := map[string]int64{}
	count := func(k string) {
		mu.Lock()
		answers[k]++
		mu.Unlock()
	}
	var wg sync.WaitGroup
	// The flooders from 127.0.0.1, the idle connections from 127.0.0.2:
	// one address's connections would otherwise crowd out the other's
	// (MaxConnectionsPerSource), and no made-up token would be reviewed.
	from := func(ip string) *net.Dialer {
		return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	}
	for range flooders {
		wg.Go(func() {
			client := &http.Client{Transport: &http.Transport{DialContext: from("127.0.0.1").DialContext, MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}
			defer client.CloseIdleConnections()
			token := make([]byte, 32)
			tick := time.NewTicker(time.Second * time.Duration(flooders) / time.Duration(rate))
			defer tick.Stop()
			for ctx.Err() == nil {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				_, _ = rand.Read(token)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tcp+volumemanager.PodsPath, nil)
				req.Header.Set("Authorization", "Bearer "+hex.EncodeToString(token))
				resp, err := client.Do(req)
				if err != nil {
					count("error")
					continue
				}
				_ = resp.Body.Close()
				count(strconv.Itoa(resp.StatusCode))
			}
		})
	}
	for range idle {
		wg.Go(func() {
			d := from("127.0.0.2")
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", tcp)
				if err == nil {
					go func() { <-ctx.Done(); _ = c.Close() }()
					_, _ = c.Read(make([]byte, 1)) // until the agent closes it
					_ = c.Close()
				}
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	return func() map[string]int64 {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return answers
	}
}

// refusedMetric is vm's csi_volmgr_http_refused_total of reason.
func refusedMetric(t *testing.T, vm *volumemanager.VolumeManager, reason string) float64 {
	t.Helper()
	mfs, err := vm.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "csi_volmgr_http_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no csi_volmgr_http_refused_total{reason=%q}", reason)
	return 0
}

// loadAverage is /proc/loadavg's first three fields.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// heapInUseMiB is the process's heap in use after a GC.
func heapInUseMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapInuse) / (1 << 20)
}
