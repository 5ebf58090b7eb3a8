package bench_test

import (
	"slices"
	"time"
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

// mean is the arithmetic mean.
func (d dist) mean() time.Duration {
	if len(d) == 0 {
		return 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
