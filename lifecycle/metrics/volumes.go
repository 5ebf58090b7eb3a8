package metrics

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// States of volume_manager_total_volumes, as the kubelet's.
const (
	StateDesired = "desired_state_of_world"
	StateActual  = "actual_state_of_world"
)

// VolumeCounts is what volume_manager_total_volumes exports, per CSI driver
// name. As in the kubelet, a volume counts once per pod that uses it:
// Desired counts the (volume, pod) pairs of the desired state, Actual those
// published (or uncertain) in the actual state.
type VolumeCounts struct {
	Desired map[string]int
	Actual  map[string]int
}

var totalVolumesDesc = prometheus.NewDesc(
	"volume_manager_total_volumes",
	"Number of volumes in Volume Manager",
	[]string{"plugin_name", "state"}, nil,
)

// volumeCollector exports volume_manager_total_volumes from the caller's
// counts at scrape time, so the numbers are read from the stores and never
// drift as maintained counters could.
type volumeCollector struct {
	counts func() VolumeCounts
}

var _ prometheus.Collector = &volumeCollector{}

// Describe implements prometheus.Collector.
func (c *volumeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- totalVolumesDesc }

// Collect implements prometheus.Collector. A driver known in either state
// is exported in both, with 0 where it has no volume, so a series drops to
// 0 rather than vanishing while the driver still has volumes elsewhere.
func (c *volumeCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.counts()
	drivers := make(map[string]struct{}, len(counts.Desired)+len(counts.Actual))
	for d := range counts.Desired {
		drivers[d] = struct{}{}
	}
	for d := range counts.Actual {
		drivers[d] = struct{}{}
	}
	for _, d := range slices.Sorted(maps.Keys(drivers)) {
		ch <- prometheus.MustNewConstMetric(totalVolumesDesc, prometheus.GaugeValue,
			float64(counts.Desired[d]), PluginName(d), StateDesired)
		ch <- prometheus.MustNewConstMetric(totalVolumesDesc, prometheus.GaugeValue,
			float64(counts.Actual[d]), PluginName(d), StateActual)
	}
}
