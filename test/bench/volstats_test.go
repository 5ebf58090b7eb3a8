package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/stats"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// statsVolumes is how many published volumes the stats benchmark asks about.
const statsVolumes = 1000

// statsRounds is how many collections one op measures (their mean is
// reported): one collection is one stats period's work.
const statsRounds = 3

// BenchmarkVolumeStats measures the volume stats loop with statsVolumes
// published volumes of the real test plugin (real bind mounts, real
// NodeGetVolumeStats that walks the volume and statfs's it): per
// collection, which is the work of one period (the kubelet's 1 minute
// volumeStatsAggPeriod, the agent's default), the agent's CPU, the
// driver's CPU and the calls the driver answers, and the wall time of one
// collection with the default 4 calls in flight.
//
// Baseline, in the same process against the same plugin: what the kubelet
// does per period (csi_metrics.go GetMetrics for every pod volume): a new
// gRPC connection per call (newV1NodeClient), NodeGetCapabilities, then
// NodeGetVolumeStats on a second new connection. x_* are agent / kubelet.
//
//	make bench   (or: go test -run='^$' -bench=VolumeStats -benchtime=1x ./test/bench/)
func BenchmarkVolumeStats(b *testing.B) {
	ctx := klog.NewContext(b.Context(), logr.Discard())
	dir, err := os.MkdirTemp("", "vstats")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	caps := plugin.Capabilities{VolumeStats: true}
	p := plugintest.Start(b, plugintest.Options{Capabilities: &caps, Verbosity: 1})
	world, targets := publishForStats(ctx, b, p, dir)

	client, err := csiclient.New(ctx, csiclient.Config{DriverName: p.Name, Endpoint: p.Endpoint})
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	collector, err := stats.New(stats.Config{
		State: world, Desired: noUses{},
		Drivers: func(string) (stats.Client, bool) { return client, true },
	})
	if err != nil {
		b.Fatal(err)
	}

	var agent, kubelet statsRun
	b.ResetTimer()
	for range b.N {
		agent.add(measureStats(b, p, func() int { return collector.Collect(ctx) }))
		b.StopTimer()
		kubelet.add(measureStats(b, p, func() int { return kubeletLikeStats(ctx, b, p.Endpoint, targets) }))
		b.StartTimer()
	}
	b.StopTimer()
	if n := len(collector.Volumes()); n != statsVolumes {
		b.Fatalf("the collector has stats of %d volumes, want %d", n, statsVolumes)
	}
	for _, s := range collector.Volumes() {
		if s.Usage == nil || s.Err != "" {
			b.Fatalf("volume %s: no usage (%s)", s.Volume, s.Err)
		}
	}
	a, k := agent.mean(), kubelet.mean()
	b.ReportMetric(ms(a.self), "agent_cpu_ms/min")
	b.ReportMetric(ms(a.driver), "driver_cpu_ms/min")
	b.ReportMetric(a.calls, "driver_calls/min")
	b.ReportMetric(ms(a.wall), "collection_ms")
	b.ReportMetric(ms(k.self), "kubelet_cpu_ms/min")
	b.ReportMetric(ms(k.driver), "kubelet_driver_cpu_ms/min")
	b.ReportMetric(k.calls, "kubelet_driver_calls/min")
	b.ReportMetric(a.self.Seconds()/k.self.Seconds(), "x_agent_cpu")
	b.ReportMetric(a.driver.Seconds()/k.driver.Seconds(), "x_driver_cpu")
	details(b, fmt.Sprintf("%d published volumes, one collection = one 1-minute period, mean of %d", statsVolumes, len(agent.rounds)), table(
		"agent: CPU / CPU share of 1 core", fmt.Sprintf("%v / %.3f%%", a.self.Round(time.Millisecond), 100*a.self.Seconds()/60),
		"agent: driver CPU, calls", fmt.Sprintf("%v, %.0f", a.driver.Round(time.Millisecond), a.calls),
		"agent: wall time of a collection", a.wall.Round(time.Millisecond),
		"kubelet-like: CPU", k.self.Round(time.Millisecond),
		"kubelet-like: driver CPU, calls", fmt.Sprintf("%v, %.0f", k.driver.Round(time.Millisecond), k.calls),
		"kubelet-like: wall time", k.wall.Round(time.Millisecond),
	))
}

// statsSample is one measured collection.
type statsSample struct {
	self, driver, wall time.Duration
	calls              float64
}

type statsRun struct{ rounds []statsSample }

func (r *statsRun) add(s []statsSample) { r.rounds = append(r.rounds, s...) }

func (r *statsRun) mean() statsSample {
	var m statsSample
	for _, s := range r.rounds {
		m.self += s.self
		m.driver += s.driver
		m.wall += s.wall
		m.calls += s.calls
	}
	n := time.Duration(len(r.rounds))
	m.self, m.driver, m.wall, m.calls = m.self/n, m.driver/n, m.wall/n, m.calls/float64(len(r.rounds))
	return m
}

// measureStats runs collect statsRounds times, each measured: this
// process's CPU, the plugin's CPU, and the plugin's calls (journal).
func measureStats(b *testing.B, p *plugintest.Plugin, collect func() int) []statsSample {
	b.Helper()
	var out []statsSample
	for range statsRounds {
		calls0 := journalCalls(b, p)
		self0, drv0 := selfCPU(), procCPU(p.PID())
		began := time.Now()
		if n := collect(); n != statsVolumes {
			b.Fatalf("collected %d volumes, want %d", n, statsVolumes)
		}
		out = append(out, statsSample{
			wall: time.Since(began), self: selfCPU() - self0, driver: procCPU(p.PID()) - drv0,
			calls: float64(journalCalls(b, p) - calls0),
		})
	}
	return out
}

// publishForStats creates and publishes statsVolumes filesystem volumes
// (the plugin without staging bind-mounts each volume's directory at its
// target) and records them in an actual state as the agent would.
func publishForStats(ctx context.Context, b *testing.B, p *plugintest.Plugin, dir string) (*asw.World, []statsTarget) {
	b.Helper()
	conn, err := p.Dial()
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	world := asw.New(asw.Options{})
	targets := make([]statsTarget, statsVolumes)
	var wg sync.WaitGroup
	errs := make(chan error, statsVolumes)
	sem := make(chan struct{}, 8)
	for i := range statsVolumes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v" + strconv.Itoa(i), VolumeCapabilities: []*csi.VolumeCapability{capability}})
			if err != nil {
				errs <- err
				return
			}
			id := resp.GetVolume().GetVolumeId()
			target := filepath.Join(dir, strconv.Itoa(i), "mount")
			if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
				errs <- err
				return
			}
			if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: capability}); err != nil {
				errs <- err
				return
			}
			vid := volume.ID{Driver: p.Name, Handle: id, PVName: "pv" + strconv.Itoa(i), AccessType: volume.Filesystem}
			name := volume.PersistentName(p.Name, id)
			world.RecordStage(name, vid, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged})
			world.RecordPublish(volume.PodKey{Volume: name, Pod: types.UID("pod-" + strconv.Itoa(i))}, vid,
				asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: target})
			targets[i] = statsTarget{id: id, path: target}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("publishing the volumes: %v", err)
	}
	b.Cleanup(func() {
		for _, t := range targets {
			_ = unix.Unmount(t.path, unix.MNT_DETACH)
		}
	})
	return world, targets
}

type statsTarget struct{ id, path string }

// kubeletLikeStats asks for every volume's stats the way the kubelet does,
// with its concurrency of one goroutine per pod volume bounded here to the
// agent's 4 so that only the calls' cost differs: a new connection for
// NodeGetCapabilities and another for NodeGetVolumeStats.
func kubeletLikeStats(ctx context.Context, b *testing.B, endpoint string, targets []statsTarget) int {
	sem := make(chan struct{}, stats.DefaultConcurrency)
	var wg sync.WaitGroup
	for _, t := range targets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			call := func(fn func(csi.NodeClient) error) {
				conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					b.Error(err)
					return
				}
				defer conn.Close()
				if err := fn(csi.NewNodeClient(conn)); err != nil {
					b.Error(err)
				}
			}
			call(func(c csi.NodeClient) error {
				_, err := c.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
				return err
			})
			call(func(c csi.NodeClient) error {
				_, err := c.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: t.id, VolumePath: t.path})
				return err
			})
		})
	}
	wg.Wait()
	return len(targets)
}

// noUses is a desired state without pods: the benchmark records no Events.
type noUses struct{}

func (noUses) PodVolume(volume.PodKey) (dsw.Use, bool) { return dsw.Use{}, false }

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the CPU time (user + system) of process pid so far.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(u+st) * clockTick
}

// journalCalls counts the calls the plugin has answered so far.
func journalCalls(b *testing.B, p *plugintest.Plugin) int {
	b.Helper()
	entries, err := p.ReadJournal()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Event == plugin.EventEnd {
			n++
		}
	}
	return n
}
