package stats

import (
	"k8s.io/apimachinery/pkg/types"
	k8smetrics "k8s.io/component-base/metrics"
)

// The kubelet's volume stats metrics (pkg/kubelet/metrics/collectors
// volume_stats.go), labelled by the volume's claim, plus the health gauge
// older kubelets exported from VOLUME_CONDITION, here from
// NodeGetVolumeHealth.
var (
	labels             = []string{"namespace", "persistentvolumeclaim"}
	capacityBytesDesc  = k8smetrics.NewDesc("kubelet_volume_stats_capacity_bytes", "Capacity in bytes of the volume", labels, nil, k8smetrics.ALPHA, "")
	availableBytesDesc = k8smetrics.NewDesc("kubelet_volume_stats_available_bytes", "Number of available bytes in the volume", labels, nil, k8smetrics.ALPHA, "")
	usedBytesDesc      = k8smetrics.NewDesc("kubelet_volume_stats_used_bytes", "Number of used bytes in the volume", labels, nil, k8smetrics.ALPHA, "")
	inodesDesc         = k8smetrics.NewDesc("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", labels, nil, k8smetrics.ALPHA, "")
	inodesFreeDesc     = k8smetrics.NewDesc("kubelet_volume_stats_inodes_free", "Number of free inodes in the volume", labels, nil, k8smetrics.ALPHA, "")
	inodesUsedDesc     = k8smetrics.NewDesc("kubelet_volume_stats_inodes_used", "Number of used inodes in the volume", labels, nil, k8smetrics.ALPHA, "")
	abnormalDesc       = k8smetrics.NewDesc("kubelet_volume_stats_health_status_abnormal",
		"Abnormal volume health status: 1 when the driver reports an adverse condition (NodeGetVolumeHealth), 0 when it reports none", labels, nil,
		k8smetrics.ALPHA, "")
)

// metricsCollector exports the last collection at scrape time: one series
// per claim, as the kubelet's (a claim is counted once however many pods
// use it).
type metricsCollector struct {
	k8smetrics.BaseStableCollector
	volumes func() []VolumeStats
}

var _ k8smetrics.StableCollector = &metricsCollector{}

// NewMetrics returns the collector of the kubelet_volume_stats_* metrics
// over volumes (Collector.Volumes), not registered: the Collector
// registers it into Config.Registerer.
func NewMetrics(volumes func() []VolumeStats) k8smetrics.StableCollector {
	return &metricsCollector{volumes: volumes}
}

// DescribeWithStability implements k8smetrics.StableCollector.
func (m *metricsCollector) DescribeWithStability(ch chan<- *k8smetrics.Desc) {
	for _, d := range []*k8smetrics.Desc{capacityBytesDesc, availableBytesDesc, usedBytesDesc, inodesDesc, inodesFreeDesc, inodesUsedDesc, abnormalDesc} {
		ch <- d
	}
}

// CollectWithStability implements k8smetrics.StableCollector.
func (m *metricsCollector) CollectWithStability(ch chan<- k8smetrics.Metric) {
	seen := map[types.NamespacedName]bool{}
	for _, s := range m.volumes() {
		if s.Claim == nil || seen[*s.Claim] {
			continue
		}
		seen[*s.Claim] = true
		gauge := func(d *k8smetrics.Desc, v *int64) {
			if v != nil {
				ch <- k8smetrics.NewLazyConstMetric(d, k8smetrics.GaugeValue, float64(*v), s.Claim.Namespace, s.Claim.Name)
			}
		}
		if u := s.Usage; u != nil {
			gauge(capacityBytesDesc, u.CapacityBytes)
			gauge(availableBytesDesc, u.AvailableBytes)
			gauge(usedBytesDesc, u.UsedBytes)
			gauge(inodesDesc, u.Inodes)
			gauge(inodesFreeDesc, u.InodesFree)
			gauge(inodesUsedDesc, u.InodesUsed)
		}
		if s.HealthSupported {
			abnormal := 0.0
			if s.Abnormal() {
				abnormal = 1
			}
			ch <- k8smetrics.NewLazyConstMetric(abnormalDesc, k8smetrics.GaugeValue, abnormal, s.Claim.Namespace, s.Claim.Name)
		}
	}
}
