package bench_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// dist is a sorted sample of durations.
type dist []time.Duration

func newDist(ds []time.Duration) dist {
	out := slices.Clone(ds)
	slices.Sort(out)
	return out
}

// q is the p-quantile (0 ≤ p ≤ 1), nearest rank.
func (d dist) q(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(p*float64(len(d))+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}

func (d dist) max() time.Duration { return d.q(1) }

// ms is d in milliseconds, for ReportMetric.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// String is "p50 / p99 / max" in milliseconds.
func (d dist) String() string {
	return fmt.Sprintf("p50 %.2fms  p90 %.2fms  p99 %.2fms  max %.2fms  (n=%d)",
		ms(d.q(.5)), ms(d.q(.9)), ms(d.q(.99)), ms(d.max()), len(d))
}

// table renders named distributions one per line.
func table(rows ...any) string {
	var sb strings.Builder
	for i := 0; i+1 < len(rows); i += 2 {
		fmt.Fprintf(&sb, "\n  %-34s %v", rows[i], rows[i+1])
	}
	return sb.String()
}

// histogramMeans renders, for the histograms of reg whose names are given,
// each series' sample count and mean: the agent's own account of where
// time went (queue waits, step durations).
func histogramMeans(reg prometheus.Gatherer, names ...string) string {
	families, err := reg.Gather()
	if err != nil {
		return "(gather: " + err.Error() + ")"
	}
	var sb strings.Builder
	for _, f := range families {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h.GetSampleCount() == 0 {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			mean := time.Duration(h.GetSampleSum() / float64(h.GetSampleCount()) * float64(time.Second))
			fmt.Fprintf(&sb, "\n  %s{%s}: n=%d mean=%v", f.GetName(), strings.Join(labels, ","), h.GetSampleCount(), mean.Round(time.Microsecond))
		}
	}
	return sb.String()
}

// details prints a multi-line part of a benchmark's report to stdout: the
// testing package keeps only the first ten lines of a benchmark's log.
func details(b *testing.B, title, text string) {
	fmt.Printf("[%s] %s:%s\n", b.Name(), title, text)
}
