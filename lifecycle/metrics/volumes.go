package metrics

import (
	"maps"
	"slices"

	k8smetrics "k8s.io/component-base/metrics"
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

// totalVolumesDesc is volume_manager_total_volumes as the kubelet defines
// it (pkg/kubelet/volumemanager/metrics).
var totalVolumesDesc = k8smetrics.NewDesc(
	"volume_manager_total_volumes",
	"Number of volumes in Volume Manager",
	[]string{"plugin_name", "state"}, nil,
	k8smetrics.ALPHA, "",
)

// volumeCollector exports volume_manager_total_volumes from the caller's
// counts at scrape time, so the numbers are read from the stores and never
// drift as maintained counters could.
type volumeCollector struct {
	k8smetrics.BaseStableCollector
	counts func() VolumeCounts
}

var _ k8smetrics.StableCollector = &volumeCollector{}

// NewVolumeCollector returns the collector of volume_manager_total_volumes
// over counts, not registered (RegisterStable registers it).
func NewVolumeCollector(counts func() VolumeCounts) k8smetrics.StableCollector {
	return &volumeCollector{counts: counts}
}

// DescribeWithStability implements k8smetrics.StableCollector.
func (c *volumeCollector) DescribeWithStability(ch chan<- *k8smetrics.Desc) { ch <- totalVolumesDesc }

// CollectWithStability implements k8smetrics.StableCollector. A driver
// known in either state is exported in both, with 0 where it has no
// volume, so a series drops to 0 rather than vanishing while the driver
// still has volumes elsewhere.
func (c *volumeCollector) CollectWithStability(ch chan<- k8smetrics.Metric) {
	counts := c.counts()
	drivers := make(map[string]struct{}, len(counts.Desired)+len(counts.Actual))
	for d := range counts.Desired {
		drivers[d] = struct{}{}
	}
	for d := range counts.Actual {
		drivers[d] = struct{}{}
	}
	for _, d := range slices.Sorted(maps.Keys(drivers)) {
		ch <- k8smetrics.NewLazyConstMetric(totalVolumesDesc, k8smetrics.GaugeValue,
			float64(counts.Desired[d]), PluginName(d), StateDesired)
		ch <- k8smetrics.NewLazyConstMetric(totalVolumesDesc, k8smetrics.GaugeValue,
			float64(counts.Actual[d]), PluginName(d), StateActual)
	}
}
