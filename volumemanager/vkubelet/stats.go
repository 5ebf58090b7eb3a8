package vkubelet

import (
	"context"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// VolumeStatsSource is what the stats helpers need of the volume manager;
// *volumemanager.VolumeManager implements it.
type VolumeStatsSource interface {
	// PodVolumeStats returns the last stats of the pod's published CSI
	// volumes, by the pod's name for them.
	PodVolumeStats(uid types.UID) []statsv1alpha1.VolumeStats
}

var _ VolumeStatsSource = &volumemanager.VolumeManager{}

// SummaryFunc serves the kubelet's stats summary (/stats/summary):
// virtual-kubelet's api.PodStatsSummaryHandlerFunc, which a provider sets
// in api.PodHandlerConfig.GetStatsSummary.
type SummaryFunc = func(ctx context.Context) (*statsv1alpha1.Summary, error)

// WithVolumeStats wraps a provider's stats summary so that each of its
// pods carries the stats of its CSI volumes (FillVolumeStats): the
// provider reports its containers, the volume manager the volumes.
//
//	api.PodHandlerConfig{GetStatsSummary: vkubelet.WithVolumeStats(vm, provider.GetStatsSummary)}
func WithVolumeStats(vm VolumeStatsSource, summary SummaryFunc) SummaryFunc {
	return func(ctx context.Context) (*statsv1alpha1.Summary, error) {
		s, err := summary(ctx)
		if err != nil || s == nil {
			return s, err
		}
		FillVolumeStats(s, vm)
		return s, nil
	}
}

// FillVolumeStats puts the last stats of each pod's CSI volumes into its
// PodStats.VolumeStats, as the kubelet's summary carries them: by the
// pod's name for the volume, with the claim (PVCRef) of a persistent one,
// sorted by name. An entry the provider made for a volume of the same name
// is replaced; entries for its other volumes (emptyDir, say) are kept.
// Pods are matched by PodRef.UID. Stats are collected every
// Config.Changes.StatsPeriod (the kubelet's minute by default) from
// drivers with GET_VOLUME_STATS: a volume published since, or of a driver
// without the capability, has none yet.
func FillVolumeStats(summary *statsv1alpha1.Summary, vm VolumeStatsSource) {
	for i := range summary.Pods {
		ps := &summary.Pods[i]
		vols := vm.PodVolumeStats(types.UID(ps.PodRef.UID))
		if len(vols) == 0 {
			continue
		}
		merged := make([]statsv1alpha1.VolumeStats, 0, len(ps.VolumeStats)+len(vols))
		for _, v := range ps.VolumeStats {
			if !slices.ContainsFunc(vols, func(c statsv1alpha1.VolumeStats) bool { return c.Name == v.Name }) {
				merged = append(merged, v)
			}
		}
		merged = append(merged, vols...)
		slices.SortStableFunc(merged, func(a, b statsv1alpha1.VolumeStats) int { return strings.Compare(a.Name, b.Name) })
		ps.VolumeStats = merged
	}
}
