package stats

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// PodVolumeStats returns the last stats of a pod's published volumes in
// the kubelet's summary API types (statsv1alpha1.VolumeStats: the pod's
// name for the volume, its claim, and FsStats), as a runtime serves them
// in /stats/summary (virtual-kubelet's PodStats.VolumeStats). Volumes whose
// driver reported no usage are left out.
func (c *Collector) PodVolumeStats(uid types.UID) []statsv1alpha1.VolumeStats {
	var out []statsv1alpha1.VolumeStats
	for _, s := range c.Volumes() {
		if s.Usage == nil || !slices.Contains(s.Pods, uid) {
			continue
		}
		use, ok := c.cfg.Desired.PodVolume(volume.PodKey{Volume: s.Volume, Pod: uid})
		if !ok {
			continue
		}
		vs := statsv1alpha1.VolumeStats{
			Name: use.Volume.SpecName,
			FsStats: statsv1alpha1.FsStats{
				Time:           metav1.NewTime(s.Time),
				CapacityBytes:  unsigned(s.Usage.CapacityBytes),
				AvailableBytes: unsigned(s.Usage.AvailableBytes),
				UsedBytes:      unsigned(s.Usage.UsedBytes),
				Inodes:         unsigned(s.Usage.Inodes),
				InodesFree:     unsigned(s.Usage.InodesFree),
				InodesUsed:     unsigned(s.Usage.InodesUsed),
			},
		}
		if s.Claim != nil {
			vs.PVCRef = &statsv1alpha1.PVCReference{Namespace: s.Claim.Namespace, Name: s.Claim.Name}
		}
		out = append(out, vs)
	}
	slices.SortFunc(out, func(a, b statsv1alpha1.VolumeStats) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// unsigned converts a driver's count, never negative in the summary API.
func unsigned(v *int64) *uint64 {
	if v == nil {
		return nil
	}
	u := uint64(max(*v, 0))
	return &u
}
