package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// pluginDelay is what the plugin's fault rules add to every NodeStageVolume
// and NodePublishVolume.
const pluginDelay = 10 * time.Millisecond

// BenchmarkDriverBound compares the agent with the driver-bound ideal for
// benchPods pods × 1 volume on a plugin that takes pluginDelay more for
// each NodeStageVolume and NodePublishVolume.
//
// Agent time: the pods, PVCs and PVs exist and every pod is in the agent's
// desired state while the driver is not registered (its registration
// socket waits outside the registration directory) and the agent is idle;
// the socket is then moved in. Agent time runs from the registry's
// Registered event, which hands the whole backlog to the reconciler at
// once, to the last pod's volumes published (ReadyObserver clock).
//
// Ideal time: the same CSI calls, NodeStageVolume then NodePublishVolume
// for each volume, issued by this process straight to the same plugin
// process over csiclient, with the reconciler's concurrency: volumeWorkers
// goroutines stage, each staged volume goes to a queue that podWorkers
// goroutines publish from — the reconciler's two queues with nothing else
// (no API server, no desired/actual state, no records on disk; directories
// made beforehand). It runs before and after the agent, and the ratio is
// taken against the faster of the two. For reference, the bound that the
// delay alone sets is benchPods × pluginDelay / volumeWorkers + pluginDelay.
//
// One op is: create the pods, wait until the agent desires them all and is
// idle (untimed), register the driver, wait for every pod ready (timed),
// delete the pods, wait for teardown, and deregister the driver (untimed).
//
//	make bench   (or: go test -run='^$' -bench=DriverBound -benchtime=1x ./test/bench/)
func BenchmarkDriverBound(b *testing.B) {
	began := time.Now()
	fx := k8stest.New(b)
	ctx := klog.NewContext(b.Context(), logr.Discard())
	env := newBenchEnv(ctx, b, fx, envOptions{driver: "ideal.bench.csi-volmgr.io"})
	if err := env.plugin.SetFaults(
		plugin.FaultRule{Method: "NodeStageVolume", Delay: pluginDelay},
		plugin.FaultRule{Method: "NodePublishVolume", Delay: pluginDelay},
	); err != nil {
		b.Fatalf("setting the plugin's delay: %v", err)
	}
	idealBefore, idealCalls, idealCPU := env.runIdeal(ctx, b)

	var (
		agentTime  time.Duration
		agentCalls dist
		api, cpu   string
	)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		pods := env.createPods(ctx, b, fmt.Sprintf("drv%d", i))
		env.waitIdle(ctx, b, len(pods))
		apiBefore, cpuBefore := apiRequests.snapshot(), cpuNow()
		b.StartTimer()
		stopProfile := profileWindow(b, fmt.Sprintf("agent%d", i))
		// The reconciler's workers start their first calls while the
		// registry still tells its other observers, the benchmark's last:
		// calls are counted from before the socket moves in.
		moved := time.Now()
		registered := env.register(ctx, b)
		obs := env.waitReady(ctx, b, len(pods))
		stopProfile()
		b.StopTimer()
		last := registered
		for _, o := range obs {
			if o.at.After(last) {
				last = o.at
			}
		}
		agentTime += last.Sub(registered)
		if i == 0 {
			cpu = cpuNow().since(cpuBefore, time.Since(registered))
		}
		calls := env.calls(b, moved, "NodeStageVolume", "NodePublishVolume")
		agentCalls = checkCalls(b, calls, len(pods))
		if i == 0 {
			api = apiRequests.since(apiBefore)
		}
		env.deletePods(ctx, b)
		env.unregister(ctx, b)
	}
	idealAfter, _, _ := env.runIdeal(ctx, b)

	agentTime /= time.Duration(b.N)
	ideal := min(idealBefore, idealAfter)
	bound := time.Duration(benchPods)*pluginDelay/volumeWorkers + pluginDelay
	b.ReportMetric(agentTime.Seconds()/ideal.Seconds(), "x_ideal")
	b.ReportMetric(agentTime.Seconds(), "agent_s")
	b.ReportMetric(ideal.Seconds(), "ideal_s")
	b.ReportMetric(bound.Seconds(), "delay_bound_s")
	b.ReportMetric(time.Since(began).Seconds(), "total_s")
	b.Logf("%d pods × 1 volume, plugin +%v per stage and publish, %d volume / %d pod workers", benchPods, pluginDelay, volumeWorkers, podWorkers)
	b.Logf("agent %v (registered → last pod ready); ideal %v before, %v after the agent; agent/ideal = %.3f; delay-only bound %v; total run %v",
		agentTime.Round(time.Millisecond), idealBefore.Round(time.Millisecond), idealAfter.Round(time.Millisecond),
		agentTime.Seconds()/ideal.Seconds(), bound, time.Since(began).Round(time.Millisecond))
	details(b, "time inside the plugin per call", table("agent's calls", agentCalls, "ideal's calls", idealCalls))
	details(b, "CPU used while the agent worked (first op)", cpu)
	details(b, "CPU used by the ideal run before the agent", idealCPU)
	details(b, "API requests of this process while the agent worked (first op)", api)
	details(b, "agent metrics over the whole run", histogramMeans(env.agent.vm.Metrics(),
		"workqueue_queue_duration_seconds", "workqueue_work_duration_seconds", "storage_operation_duration_seconds"))
	if agentTime.Seconds() > 1.2*ideal.Seconds() {
		b.Logf("MISSED the issue's target (≤ 1.2 × ideal)")
	}
}

// checkCalls checks that the plugin got exactly one successful stage and
// one successful publish per pod, and returns the time each spent inside
// the plugin.
func checkCalls(b *testing.B, calls []plugin.Call, pods int) dist {
	b.Helper()
	count := map[string]int{}
	var inside []time.Duration
	for _, c := range calls {
		if !c.Done || c.Code() != codes.OK {
			b.Fatalf("%s of %s did not succeed: %+v", c.Begin.Method, c.Begin.VolumeID, c.End)
		}
		count[c.Begin.Method]++
		inside = append(inside, c.End.Time.Sub(c.Begin.Time))
	}
	if count["NodeStageVolume"] != pods || count["NodePublishVolume"] != pods {
		b.Fatalf("plugin calls %v, want %d NodeStageVolume and %d NodePublishVolume", count, pods, pods)
	}
	return newDist(inside)
}

// waitIdle waits until the agent desires n pod volumes of the driver and
// all its queues are empty and idle, so that the measured run starts from
// a quiet agent with the whole desired state in place.
func (e *benchEnv) waitIdle(ctx context.Context, b *testing.B, n int) {
	b.Helper()
	pluginName := metrics.PluginName(e.opts.driver)
	waitFor(ctx, b, 100*time.Millisecond, runTimeout, fmt.Sprintf("%d pod volumes desired and the agent idle", n), func() (bool, error) {
		families, err := e.agent.vm.Metrics().Gather()
		if err != nil {
			return false, err
		}
		desired, busy := 0.0, 0.0
		for _, f := range families {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				switch f.GetName() {
				case "volume_manager_total_volumes":
					if labels["plugin_name"] == pluginName && labels["state"] == metrics.StateDesired {
						desired = m.GetGauge().GetValue()
					}
				case "workqueue_depth", "workqueue_unfinished_work_seconds":
					busy += m.GetGauge().GetValue()
				}
			}
		}
		return int(desired) == n && busy == 0, nil
	})
}

// runIdeal issues NodeStageVolume then NodePublishVolume for every volume
// straight to the plugin, with volumeWorkers stagers feeding podWorkers
// publishers, and returns the time from the first call to the last publish
// returning, the time each call spent inside the plugin and the CPU used
// meanwhile. Then, untimed,
// it unpublishes and unstages everything and checks nothing is left
// mounted.
func (e *benchEnv) runIdeal(ctx context.Context, b *testing.B) (time.Duration, dist, string) {
	b.Helper()
	dir := filepath.Join(e.root, "ideal")
	staging := func(i int) string { return filepath.Join(dir, strconv.Itoa(i), "globalmount") }
	target := func(i int) string { return filepath.Join(dir, strconv.Itoa(i), "mount") }
	for i := range e.volumes {
		if err := os.MkdirAll(staging(i), 0o750); err != nil {
			b.Fatal(err)
		}
	}
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	var (
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}

	stageQ, publishQ := make(chan int, len(e.volumes)), make(chan int, len(e.volumes))
	for i := range e.volumes {
		stageQ <- i
	}
	close(stageQ)
	var stagers, publishers sync.WaitGroup
	stopProfile := profileWindow(b, "ideal")
	cpuBefore := cpuNow()
	start := time.Now()
	for range volumeWorkers {
		stagers.Go(func() {
			for i := range stageQ {
				if err := e.csi.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
					VolumeId: e.volumes[i].handle, StagingTargetPath: staging(i), VolumeCapability: capability,
				}); err != nil {
					fail(fmt.Errorf("ideal NodeStageVolume %d: %w", i, err))
					continue
				}
				publishQ <- i
			}
		})
	}
	go func() { stagers.Wait(); close(publishQ) }()
	for range podWorkers {
		publishers.Go(func() {
			for i := range publishQ {
				if err := e.csi.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
					VolumeId: e.volumes[i].handle, StagingTargetPath: staging(i), TargetPath: target(i), VolumeCapability: capability,
				}); err != nil {
					fail(fmt.Errorf("ideal NodePublishVolume %d: %w", i, err))
				}
			}
		})
	}
	publishers.Wait()
	took := time.Since(start)
	stopProfile()
	cpu := cpuNow().since(cpuBefore, took)
	if first != nil {
		b.Fatal(first)
	}
	inside := checkCalls(b, e.calls(b, start, "NodeStageVolume", "NodePublishVolume"), len(e.volumes))

	parallel(b, len(e.volumes), func(i int) error {
		if err := e.csi.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: e.volumes[i].handle, TargetPath: target(i)}); err != nil {
			return fmt.Errorf("ideal NodeUnpublishVolume %d: %w", i, err)
		}
		if err := e.csi.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: e.volumes[i].handle, StagingTargetPath: staging(i)}); err != nil {
			return fmt.Errorf("ideal NodeUnstageVolume %d: %w", i, err)
		}
		return nil
	})
	if left := mountsBelow(b, dir); len(left) > 0 {
		b.Fatalf("%d mounts left below %s after the ideal run, e.g. %s", len(left), dir, left[0])
	}
	if err := os.RemoveAll(dir); err != nil {
		b.Fatal(err)
	}
	return took, inside, cpu
}
