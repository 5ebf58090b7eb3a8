package stats

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// The kubelet's volume stats metrics (pkg/kubelet/metrics/collectors
// volume_stats.go), labelled by the volume's claim, plus the health gauge
// older kubelets exported from VOLUME_CONDITION, here from
// NodeGetVolumeHealth.
var (
	labels             = []string{"namespace", "persistentvolumeclaim"}
	capacityBytesDesc  = prometheus.NewDesc("kubelet_volume_stats_capacity_bytes", "Capacity in bytes of the volume", labels, nil)
	availableBytesDesc = prometheus.NewDesc("kubelet_volume_stats_available_bytes", "Number of available bytes in the volume", labels, nil)
	usedBytesDesc      = prometheus.NewDesc("kubelet_volume_stats_used_bytes", "Number of used bytes in the volume", labels, nil)
	inodesDesc         = prometheus.NewDesc("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", labels, nil)
	inodesFreeDesc     = prometheus.NewDesc("kubelet_volume_stats_inodes_free", "Number of free inodes in the volume", labels, nil)
	inodesUsedDesc     = prometheus.NewDesc("kubelet_volume_stats_inodes_used", "Number of used inodes in the volume", labels, nil)
	abnormalDesc       = prometheus.NewDesc("kubelet_volume_stats_health_status_abnormal",
		"Abnormal volume health status: 1 when the driver reports an adverse condition (NodeGetVolumeHealth), 0 when it reports none", labels, nil)
)

// metricsCollector exports the last collection at scrape time: one series
// per claim, as the kubelet's (a claim is counted once however many pods
// use it).
type metricsCollector struct{ c *Collector }

var _ prometheus.Collector = &metricsCollector{}

// Describe implements prometheus.Collector.
func (m *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{capacityBytesDesc, availableBytesDesc, usedBytesDesc, inodesDesc, inodesFreeDesc, inodesUsedDesc, abnormalDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[types.NamespacedName]bool{}
	for _, s := range m.c.Volumes() {
		if s.Claim == nil || seen[*s.Claim] {
			continue
		}
		seen[*s.Claim] = true
		gauge := func(d *prometheus.Desc, v *int64) {
			if v != nil {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(*v), s.Claim.Namespace, s.Claim.Name)
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
			ch <- prometheus.MustNewConstMetric(abnormalDesc, prometheus.GaugeValue, abnormal, s.Claim.Namespace, s.Claim.Name)
		}
	}
}
