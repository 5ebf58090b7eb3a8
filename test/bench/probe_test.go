package bench_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/util/wait"
)

// podReadyMetric is the histogram the Manager's ReadyObserver
// (lifecycle/metrics) records every pod-ready latency in.
const podReadyMetric = "csi_volmgr_pod_volumes_ready_seconds"

// readyProbe recovers every value the Manager hands its ReadyObserver,
// with the instant it was taken, without changing the Manager.
//
// The Manager wires its own metrics as the reconciler's ReadyObserver and
// the observer is told only a duration, so the probe combines two hooks the
// Manager does offer:
//   - reconciler.Config.Now, which the reconciler calls exactly once per
//     observation, under its status lock, right before it calls
//     ObservePodReady(Now() − FirstSeen); and
//   - the Registerer, through which the probe gets hold of the
//     csi_volmgr_pod_volumes_ready_seconds histogram.
//
// At each Now the probe reads the histogram's sample count and sum; since
// observations are serialized by that lock, the sum read at observation
// k+1 (or at the end) minus the sum read at observation k is exactly the
// duration observation k recorded. The count read at each call must grow by
// one per call, which take checks, so a change in how the reconciler uses
// its clock fails the benchmark instead of skewing it.
type readyProbe struct {
	// mu guards hist and marks.
	mu sync.Mutex
	// hist is the pod-ready histogram, captured when the Manager registers it.
	hist prometheus.Metric
	// marks are the Now calls not yet taken.
	marks []readyMark
	// notify gets a token at each Now call (dropped when one is pending).
	notify chan struct{}
}

func newReadyProbe() *readyProbe { return &readyProbe{notify: make(chan struct{}, 1)} }

// readyMark is one Now call: when, and the histogram before the
// observation it belongs to.
type readyMark struct {
	at    time.Time
	sum   float64
	count uint64
}

// readyObservation is one ReadyObserver call.
type readyObservation struct {
	// at is the reconciler's clock reading: when the pod's volumes were all
	// published.
	at time.Time
	// latency is what the ReadyObserver was given: at − the pod's FirstSeen.
	latency time.Duration
}

// firstSeen is when the populator first saw the pod.
func (o readyObservation) firstSeen() time.Time { return o.at.Add(-o.latency) }

// now is the reconciler's clock.
func (p *readyProbe) now() time.Time {
	at := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	sum, count := p.readLocked()
	p.marks = append(p.marks, readyMark{at: at, sum: sum, count: count})
	select {
	case p.notify <- struct{}{}:
	default:
	}
	return at
}

// count is the number of observations not yet taken.
func (p *readyProbe) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.marks)
}

// take returns the observations so far and forgets them. Call it once
// every pod that will become ready has; it waits (at most a second) for the
// last observation, whose clock was already read, to be recorded.
func (p *readyProbe) take(ctx context.Context) ([]readyObservation, error) {
	p.mu.Lock()
	hist := p.hist
	var want uint64
	if len(p.marks) > 0 {
		want = p.marks[0].count + uint64(len(p.marks))
	}
	p.mu.Unlock()
	if hist == nil {
		return nil, fmt.Errorf("the Manager registered no %s histogram", podReadyMetric)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, count := p.readLocked()
		return count >= want, nil
	}); err != nil {
		return nil, fmt.Errorf("waiting for the last pod-ready observation: %w", err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	marks := p.marks
	p.marks = nil
	sum, count := p.readLocked()
	marks = append(marks, readyMark{sum: sum, count: count})
	out := make([]readyObservation, 0, len(marks)-1)
	for i := range len(marks) - 1 {
		cur, next := marks[i], marks[i+1]
		if next.count != cur.count+1 {
			return nil, fmt.Errorf("clock call %d of %d: the histogram went from %d to %d samples, want exactly one per clock call",
				i+1, len(marks)-1, cur.count, next.count)
		}
		seconds := next.sum - cur.sum
		out = append(out, readyObservation{at: cur.at, latency: time.Duration(math.Round(seconds * 1e9))})
	}
	return out, nil
}

func (p *readyProbe) readLocked() (sum float64, count uint64) {
	if p.hist == nil {
		return 0, 0
	}
	var m dto.Metric
	if err := p.hist.Write(&m); err != nil {
		return math.NaN(), 0
	}
	return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
}

// registerer wraps r so that the probe captures the pod-ready histogram.
func (p *readyProbe) registerer(r prometheus.Registerer) prometheus.Registerer {
	return captureRegisterer{Registerer: r, probe: p}
}

type captureRegisterer struct {
	prometheus.Registerer
	probe *readyProbe
}

func (c captureRegisterer) Register(col prometheus.Collector) error {
	if err := c.Registerer.Register(col); err != nil {
		return err
	}
	if m, ok := col.(prometheus.Metric); ok && describes(col, podReadyMetric) {
		c.probe.mu.Lock()
		c.probe.hist = m
		c.probe.mu.Unlock()
	}
	return nil
}

func (c captureRegisterer) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

// describes says whether col describes the metric called name.
func describes(col prometheus.Collector, name string) bool {
	ch := make(chan *prometheus.Desc, 16)
	go func() { col.Describe(ch); close(ch) }()
	found := false
	for d := range ch {
		// Desc has no accessor for its name; its String form is stable.
		found = found || strings.Contains(d.String(), fmt.Sprintf("fqName: %q", name))
	}
	return found
}
