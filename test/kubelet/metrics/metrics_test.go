package metrics

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/kubernetes/pkg/kubelet/metrics/collectors"
	serverstats "k8s.io/kubernetes/pkg/kubelet/server/stats"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager/cache"
	vmmetrics "k8s.io/kubernetes/pkg/kubelet/volumemanager/metrics"
	kvolume "k8s.io/kubernetes/pkg/volume"
	volumeutil "k8s.io/kubernetes/pkg/volume/util"
	"k8s.io/kubernetes/pkg/volume/util/operationexecutor"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/stats"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// kubeletVolumeMetrics are the kubelet's volume metrics csi-volmgr exports.
// The kubelet's others have no counterpart: volume_operation_total_seconds
// (the attach/detach controller's), reconstruct_volume_operations_* and
// force_cleaned_failed_volume_operation* (csi-volmgr logs its
// reconstruction instead).
var kubeletVolumeMetrics = []string{
	"storage_operation_duration_seconds",
	"csi_operations_seconds",
	"volume_manager_total_volumes",
	"kubelet_volume_stats_capacity_bytes",
	"kubelet_volume_stats_available_bytes",
	"kubelet_volume_stats_used_bytes",
	"kubelet_volume_stats_inodes",
	"kubelet_volume_stats_inodes_free",
	"kubelet_volume_stats_inodes_used",
}

// family is what is compared of a metric family.
type family struct {
	Type   dto.MetricType
	Help   string
	Labels []string
}

// TestVolumeMetricsSameAsKubelet: every volume metric csi-volmgr shares
// with the kubelet has the kubelet's name, type, help (with its stability
// level) and label names.
func TestVolumeMetricsSameAsKubelet(t *testing.T) {
	theirs := kubeletFamilies(t)
	ours := csiVolmgrFamilies(t)
	for _, name := range kubeletVolumeMetrics {
		k, ok := theirs[name]
		if !ok {
			t.Errorf("the kubelet exported no %s: its definitions changed", name)
			continue
		}
		o, ok := ours[name]
		if !ok {
			t.Errorf("csi-volmgr exported no %s; the kubelet's is %+v", name, k)
			continue
		}
		if o.Type != k.Type || o.Help != k.Help || !slices.Equal(o.Labels, k.Labels) {
			t.Errorf("%s:\n  csi-volmgr  %v %q %v\n  kubelet     %v %q %v", name, o.Type, o.Help, o.Labels, k.Type, k.Help, k.Labels)
		}
	}
	// A metric of csi-volmgr under a kubelet name must be the kubelet's.
	for name := range ours {
		if _, ok := theirs[name]; !ok && (strings.HasPrefix(name, "kubelet_") || name == "volume_manager_total_volumes") {
			if name != "kubelet_volume_stats_health_status_abnormal" { // the health gauge older kubelets had
				t.Errorf("csi-volmgr exports %s, which the kubelet does not define", name)
			}
		}
	}
}

// kubeletFamilies records one sample in each of the kubelet's volume
// metrics and gathers them.
func kubeletFamilies(t *testing.T) map[string]family {
	t.Helper()
	volumeutil.RegisterMetrics() // storage_operation_duration_seconds, csi_operations_seconds
	volumeutil.StorageOperationMetric.WithLabelValues("kubernetes.io/csi:d", "mount_device", "success", "false").Observe(1)
	volumeutil.RecordCSIOperationLatencyMetrics("d", "/csi.v1.Node/NodeStageVolume", nil, time.Second, "false")
	vmmetrics.Register(oneMountedVolume{}, noVolumesToMount{}, &kvolume.VolumePluginMgr{})
	reg := k8smetrics.NewKubeRegistry()
	reg.CustomMustRegister(collectors.NewVolumeStatsCollector(oneClaimStats{}))
	return gather(t, legacyregistry.DefaultGatherer, reg)
}

// csiVolmgrFamilies records one sample in each of csi-volmgr's volume
// metrics and gathers them.
func csiVolmgrFamilies(t *testing.T) map[string]family {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, Volumes: func() metrics.VolumeCounts {
		return metrics.VolumeCounts{Actual: map[string]int{"d": 1}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	m.ObserveOperation("d", volume.StepStage, volume.Filesystem, false, nil, time.Second)
	n := int64(1)
	claim := types.NamespacedName{Namespace: "ns", Name: "pvc"}
	usage := &stats.Usage{CapacityBytes: &n, AvailableBytes: &n, UsedBytes: &n, Inodes: &n, InodesFree: &n, InodesUsed: &n}
	if err := metrics.RegisterStable(reg, stats.NewMetrics(func() []stats.VolumeStats {
		return []stats.VolumeStats{{Claim: &claim, Usage: usage, HealthSupported: true}}
	})); err != nil {
		t.Fatal(err)
	}
	csi := csiclient.NewMetrics()
	csi.Record("d", "/csi.v1.Node/NodeStageVolume", nil, time.Second)
	return gather(t, reg, csi)
}

func gather(t *testing.T, gatherers ...prometheus.Gatherer) map[string]family {
	t.Helper()
	mfs, err := prometheus.Gatherers(gatherers).Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]family{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		labels := map[string]bool{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = true
		}
		out[mf.GetName()] = family{Type: mf.GetType(), Help: mf.GetHelp(), Labels: slices.Sorted(maps.Keys(labels))}
	}
	return out
}

// oneMountedVolume is the kubelet's actual state with one mounted volume;
// only what its volume_manager_total_volumes collector reads is there.
type oneMountedVolume struct{ cache.ActualStateOfWorld }

func (oneMountedVolume) GetMountedVolumes() []cache.MountedVolume {
	return []cache.MountedVolume{{MountedVolume: operationexecutor.MountedVolume{PluginName: "kubernetes.io/csi"}}}
}

// noVolumesToMount is the kubelet's empty desired state.
type noVolumesToMount struct{ cache.DesiredStateOfWorld }

func (noVolumesToMount) GetVolumesToMount() []cache.VolumeToMount { return nil }

// oneClaimStats is the kubelet's stats provider with one pod whose volume
// is bound to a claim.
type oneClaimStats struct{ serverstats.Provider }

func (oneClaimStats) ListPodStats(context.Context) ([]statsapi.PodStats, error) {
	n := uint64(1)
	return []statsapi.PodStats{{VolumeStats: []statsapi.VolumeStats{{
		FsStats: statsapi.FsStats{CapacityBytes: &n, AvailableBytes: &n, UsedBytes: &n, Inodes: &n, InodesFree: &n, InodesUsed: &n},
		PVCRef:  &statsapi.PVCReference{Namespace: "ns", Name: "pvc"},
	}}}}, nil
}
