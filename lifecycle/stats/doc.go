// Package stats collects the usage and health of the node's published
// volumes from their CSI drivers (NodeGetVolumeStats, NodeGetVolumeHealth)
// on a period, and serves them as the kubelet's kubelet_volume_stats_*
// metrics, to the status API and to a runtime's /stats/summary. See
// Collector.
package stats
