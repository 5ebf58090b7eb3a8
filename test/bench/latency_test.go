package bench_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// clockSkew is how far apart the agent's and the plugin's readings of the
// same host clock may be when the benchmark checks that a pod's calls fall
// inside its first-seen → ready window.
const clockSkew = time.Millisecond

// BenchmarkPodReadyLatency measures what the agent adds between a pod's
// ADD event and its volumes being published, with a zero-delay plugin, over
// benchPods pods that each have their own PVC and PV on the test plugin
// (bound before the pods exist; attachRequired=false). The agent runs with
// the `run` command's defaults (API QPS 50, burst 100; 8 volume and 32 pod
// workers).
//
// Per pod it takes
//   - ready: what the Manager's ReadyObserver records, pod first seen (the
//     populator's first informer event) → all volumes published;
//   - plugin: the time the plugin spent inside that pod's NodeStageVolume
//     and NodePublishVolume calls (journal begin → end);
//   - added = ready − plugin: the agent's own share, split into before the
//     stage call (populate, PVC/PV watches, queue), between stage and
//     publish, and after publish.
//
// It runs two phases, each followed by deleting the pods and waiting until
// every volume is unpublished, unstaged and unmounted:
//
//   - serial: one pod at a time, each created when the previous one is
//     ready. Nothing queues, so added is the agent's overhead; the issue's
//     targets (≤ 2 ms p50, ≤ 20 ms p99) apply to this phase.
//
//   - burst: all pods created at once by `creators` goroutines: the
//     agent's throughput (pods/s from the first pod seen to the last
//     ready), and the latency a pod sees when a thousand arrive together.
//
//     make bench   (or: go test -run='^$' -bench=PodReadyLatency -benchtime=1x ./test/bench/)
func BenchmarkPodReadyLatency(b *testing.B) {
	began := time.Now()
	fx := k8stest.New(b)
	ctx := klog.NewContext(b.Context(), logr.Discard())
	env := newBenchEnv(ctx, b, fx, envOptions{driver: "latency.bench.csi-volmgr.io", registered: true})
	setup := time.Since(began)

	var serial, burst latencyRun
	b.ResetTimer()
	for i := range b.N {
		serial.add(env.measure(ctx, b, fmt.Sprintf("serial%d", i), env.createPodsSerially))
		burst.add(env.measure(ctx, b, fmt.Sprintf("burst%d", i), env.createPods))
	}
	b.StopTimer()
	reference := env.referenceCosts(ctx, b)

	added, ready := serial.dists()
	bAdded, bReady := burst.dists()
	b.ReportMetric(ms(added.q(.5)), "added_p50_ms")
	b.ReportMetric(ms(added.q(.99)), "added_p99_ms")
	b.ReportMetric(ms(ready.q(.5)), "ready_p50_ms")
	b.ReportMetric(ms(ready.q(.99)), "ready_p99_ms")
	b.ReportMetric(burst.throughput(), "burst_pods/s")
	b.ReportMetric(ms(bReady.q(.5)), "burst_ready_p50_ms")
	b.ReportMetric(ms(bReady.q(.99)), "burst_ready_p99_ms")
	b.ReportMetric(time.Since(began).Seconds(), "total_s")
	b.Logf("%d pods × 1 PVC/PV, zero-delay plugin, setup %v, total run %v", benchPods, setup.Round(time.Millisecond),
		time.Since(began).Round(time.Millisecond))
	b.Logf("serial: added p50 %.2fms p99 %.2fms; ready p50 %.2fms p99 %.2fms; teardown %v",
		ms(added.q(.5)), ms(added.q(.99)), ms(ready.q(.5)), ms(ready.q(.99)), serial.teardown.Round(time.Millisecond))
	b.Logf("burst: %.1f pods/s (created at %.0f/s); added p50 %.0fms p99 %.0fms; ready p50 %.0fms p99 %.0fms; teardown %v",
		burst.throughput(), burst.createRate(), ms(bAdded.q(.5)), ms(bAdded.q(.99)), ms(bReady.q(.5)), ms(bReady.q(.99)),
		burst.teardown.Round(time.Millisecond))
	details(b, "reference costs on this machine (measured after the run)", reference)
	serial.details(b, "serial")
	burst.details(b, "burst")
	details(b, "agent metrics over the whole run", histogramMeans(env.agent.metrics,
		"workqueue_queue_duration_seconds", "workqueue_work_duration_seconds", "storage_operation_duration_seconds"))
	if added.q(.5) > 2*time.Millisecond || added.q(.99) > 20*time.Millisecond {
		b.Logf("MISSED the issue's targets (added ≤ 2ms p50, ≤ 20ms p99)")
	}
}

// latencyRun accumulates the measurements of one phase over the ops.
type latencyRun struct {
	samples            []podSample
	span, create       time.Duration
	teardown           time.Duration
	ops                int
	firstCPU, firstAPI string
}

func (r *latencyRun) add(o latencyRun) {
	r.samples = append(r.samples, o.samples...)
	r.span += o.span
	r.create += o.create
	r.teardown += o.teardown
	if r.ops == 0 {
		r.firstCPU, r.firstAPI = o.firstCPU, o.firstAPI
	}
	r.ops++
}

func (r *latencyRun) dists() (added, ready dist) {
	var a, rd []time.Duration
	for _, s := range r.samples {
		a, rd = append(a, s.ready-s.plugin), append(rd, s.ready)
	}
	return newDist(a), newDist(rd)
}

// throughput is pods per second from the first pod seen to the last ready.
func (r *latencyRun) throughput() float64 { return float64(len(r.samples)) / r.span.Seconds() }

// createRate is pods per second the benchmark created.
func (r *latencyRun) createRate() float64 { return float64(len(r.samples)) / r.create.Seconds() }

func (r *latencyRun) details(b *testing.B, phase string) {
	var ready, pluginT, added, before, between, after, toPVC, toPV, toStage []time.Duration
	for _, s := range r.samples {
		ready, pluginT, added = append(ready, s.ready), append(pluginT, s.plugin), append(added, s.ready-s.plugin)
		before, between, after = append(before, s.beforeStage), append(between, s.between), append(after, s.afterPublish)
		if s.watched {
			toPVC, toPV, toStage = append(toPVC, s.toPVCWatch), append(toPV, s.toPVWatch), append(toStage, s.toStage)
		}
	}
	details(b, phase+": per pod", table(
		"ready (ReadyObserver)", newDist(ready),
		"plugin (stage+publish in plugin)", newDist(pluginT),
		"added = ready − plugin", newDist(added),
		"first seen → stage call begins", newDist(before),
		"  first seen → PVC watch sent", newDist(toPVC),
		"  PVC watch sent → PV watch sent", newDist(toPV),
		"  PV watch sent → stage call begins", newDist(toStage),
		"stage returned → publish begins", newDist(between),
		"publish returned → ready", newDist(after),
	)+fmt.Sprintf("\n  throughput %.1f pods/s (first seen → last ready), created at %.1f pods/s, teardown %v/op",
		r.throughput(), r.createRate(), (r.teardown/time.Duration(max(r.ops, 1))).Round(time.Millisecond)))
	details(b, phase+": CPU from the first create to the last pod ready (first op)", r.firstCPU)
	details(b, phase+": API requests of this process meanwhile (first op)", r.firstAPI)
}

// measure creates the pods with create, waits until all are ready, pairs
// them with the ReadyObserver's observations and the plugin's calls, and
// then deletes them and waits for the teardown.
func (e *benchEnv) measure(ctx context.Context, b *testing.B,
	prefix string, create func(context.Context, *testing.B, string) []benchPod) latencyRun {
	b.Helper()
	stopProfile := profileWindow(b, prefix)
	apiBefore, cpuBefore := apiRequests.snapshot(), cpuNow()
	start := time.Now()
	pods := create(ctx, b, prefix)
	created := time.Since(start)
	obs := e.waitReady(ctx, b, len(pods))
	stopProfile()
	r := latencyRun{create: created, firstCPU: cpuNow().since(cpuBefore, time.Since(start)), firstAPI: apiRequests.since(apiBefore)}
	b.StopTimer()
	var first, last time.Time
	r.samples, first, last = podSamples(b, pods, obs, e.calls(b, start, "NodeStageVolume", "NodePublishVolume"), e.agent.requests)
	r.span = last.Sub(first)
	b.StartTimer()
	r.teardown = e.deletePods(ctx, b)
	return r
}

// createPodsSerially creates the pods one at a time, each once the agent
// observed the previous one ready, and returns them in creation order.
func (e *benchEnv) createPodsSerially(ctx context.Context, b *testing.B, prefix string) []benchPod {
	b.Helper()
	probe := e.agent.probe
	select { // a token left from an earlier phase
	case <-probe.notify:
	default:
	}
	pods := make([]benchPod, 0, len(e.volumes))
	for i, v := range e.volumes {
		p, err := e.creator.CoreV1().Pods(e.fx.Namespace).Create(ctx, newPod(fmt.Sprintf("%s-%04d", prefix, i), e.fx.NodeName, v.claim), metav1.CreateOptions{})
		if err != nil {
			b.Fatalf("creating pod %d: %v", i, err)
		}
		bp, err := benchPodOf(p, v)
		if err != nil {
			b.Fatal(err)
		}
		pods = append(pods, bp)
		select {
		case <-probe.notify:
		case <-time.After(runTimeout):
			b.Fatalf("pod %d not ready within %v", i, runTimeout)
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
		if n := probe.count(); n != i+1 {
			b.Fatalf("%d pods ready after pod %d, want %d", n, i, i+1)
		}
	}
	return pods
}

// newPod is a pod on node whose one container mounts claim.
func newPod(name, node, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "app", Image: "busybox",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}

// benchPodOf records a created pod; the resourceVersion of its creation is
// the position of its ADD event in the agent's pod watch.
func benchPodOf(p *corev1.Pod, v benchVolume) (benchPod, error) {
	rv, err := strconv.ParseInt(p.ResourceVersion, 10, 64)
	if err != nil {
		return benchPod{}, fmt.Errorf("pod %s: resourceVersion %q is not a number: %w", p.Name, p.ResourceVersion, err)
	}
	return benchPod{uid: p.UID, rv: rv, volume: v}, nil
}

// podSample is one pod's latency and its parts.
type podSample struct {
	ready, plugin                      time.Duration
	beforeStage, between, afterPublish time.Duration
	// beforeStage split at the agent's watch requests for the pod's PVC
	// and PV: seen → PVC watch sent → PV watch sent → stage call begins.
	// watched is false when a request was not found.
	toPVCWatch, toPVWatch, toStage time.Duration
	watched                        bool
}

// podSamples pairs the pods with the ReadyObserver's observations and the
// plugin's calls. The k-th pod by creation resourceVersion is the k-th pod
// the agent's pod informer saw, and so the pod with the k-th earliest
// FirstSeen; the pairing is then checked against the journal: each pod's
// stage must begin after it was first seen and its publish end before it
// was ready. It returns the first FirstSeen and the last ready time too.
func podSamples(b *testing.B, pods []benchPod, obs []readyObservation, calls []plugin.Call, reqs *requestLog) (out []podSample, first, last time.Time) {
	b.Helper()
	sortBy(pods, func(p benchPod) int64 { return p.rv })
	sortBy(obs, func(o readyObservation) int64 { return o.firstSeen().UnixNano() })
	byHandle := map[string][]plugin.Call{}
	for _, c := range calls {
		byHandle[c.Begin.VolumeID] = append(byHandle[c.Begin.VolumeID], c)
	}
	first, last = obs[0].firstSeen(), obs[0].at
	for k, p := range pods {
		o := obs[k]
		seen := o.firstSeen()
		if o.at.After(last) {
			last = o.at
		}
		s := podSample{ready: o.latency}
		var stageBegin, stageEnd, publishBegin, publishEnd time.Time
		for _, c := range byHandle[p.volume.handle] {
			if !c.Done || c.Code() != codes.OK {
				b.Fatalf("pod %d: %s of volume %s did not succeed: %+v", k, c.Begin.Method, p.volume.handle, c.End)
			}
			s.plugin += c.End.Time.Sub(c.Begin.Time)
			switch c.Begin.Method {
			case "NodeStageVolume":
				if stageBegin.IsZero() {
					stageBegin = c.Begin.Time
				}
				stageEnd = c.End.Time
			case "NodePublishVolume":
				if publishBegin.IsZero() {
					publishBegin = c.Begin.Time
				}
				publishEnd = c.End.Time
			}
		}
		if stageBegin.IsZero() || publishBegin.IsZero() {
			b.Fatalf("pod %d (volume %s) is ready but the plugin has no stage or publish call for it", k, p.volume.handle)
		}
		if stageBegin.Before(seen.Add(-clockSkew)) || publishEnd.After(o.at.Add(clockSkew)) {
			b.Fatalf("pairing broken: pod %d (volume %s) first seen %s, ready %s, but staged from %s and published until %s",
				k, p.volume.handle, seen.Format(time.StampMicro), o.at.Format(time.StampMicro),
				stageBegin.Format(time.StampMicro), publishEnd.Format(time.StampMicro))
		}
		s.beforeStage = stageBegin.Sub(seen)
		pvcAt, okPVC := reqs.firstWatch(seen.Add(-clockSkew), "/persistentvolumeclaims?", "metadata.name%3D"+p.volume.claim)
		pvAt, okPV := reqs.firstWatch(seen.Add(-clockSkew), "/persistentvolumes?", "metadata.name%3D"+p.volume.pv)
		if s.watched = okPVC && okPV; s.watched {
			s.toPVCWatch, s.toPVWatch, s.toStage = pvcAt.Sub(seen), pvAt.Sub(pvcAt), stageBegin.Sub(pvAt)
		}
		s.between = publishBegin.Sub(stageEnd)
		s.afterPublish = o.at.Sub(publishEnd)
		out = append(out, s)
	}
	return out, first, last
}
