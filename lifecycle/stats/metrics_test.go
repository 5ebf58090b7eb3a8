package stats_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/stats"
)

// TestMetricsOnePerClaim: the kubelet_volume_stats_* gauges come once per
// claim (the first volume of it wins), with the kubelet's help and
// stability; volumes without a claim are left out; the health gauge is 1
// while the driver reports an adverse condition.
func TestMetricsOnePerClaim(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	claim := types.NamespacedName{Namespace: "ns", Name: "pvc"}
	used, used2 := int64(10), int64(20)
	vols := []stats.VolumeStats{
		{Claim: &claim, Usage: &stats.Usage{UsedBytes: &used}, HealthSupported: true,
			Health: []corev1.VolumeHealthCondition{{Status: corev1.VolumeHealthInaccessible, Reason: "Gone"}}},
		{Claim: &claim, Usage: &stats.Usage{UsedBytes: &used2}},
		{Usage: &stats.Usage{UsedBytes: &used2}},
	}
	if err := metrics.RegisterStable(reg, stats.NewMetrics(func() []stats.VolumeStats { return vols })); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP kubelet_volume_stats_used_bytes [ALPHA] Number of used bytes in the volume
# TYPE kubelet_volume_stats_used_bytes gauge
kubelet_volume_stats_used_bytes{namespace="ns",persistentvolumeclaim="pvc"} 10
# HELP kubelet_volume_stats_health_status_abnormal [ALPHA] Abnormal volume health status: 1 when the driver reports an adverse condition (NodeGetVolumeHealth), 0 when it reports none
# TYPE kubelet_volume_stats_health_status_abnormal gauge
kubelet_volume_stats_health_status_abnormal{namespace="ns",persistentvolumeclaim="pvc"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
