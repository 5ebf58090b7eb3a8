package volumemanager

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/stats"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// VolumeStatsStatus is a volume's last stats and health in the JSON status
// API, as its driver reported them.
type VolumeStatsStatus struct {
	Time           time.Time `json:"time"`
	CapacityBytes  *int64    `json:"capacityBytes,omitempty"`
	AvailableBytes *int64    `json:"availableBytes,omitempty"`
	UsedBytes      *int64    `json:"usedBytes,omitempty"`
	Inodes         *int64    `json:"inodes,omitempty"`
	InodesFree     *int64    `json:"inodesFree,omitempty"`
	InodesUsed     *int64    `json:"inodesUsed,omitempty"`
	// Health is set when the driver reports health: "Healthy", or the
	// adverse conditions.
	Health []HealthStatus `json:"health,omitempty"`
	Error  string         `json:"error,omitempty"`
}

// HealthStatus is one health condition of a volume.
type HealthStatus struct {
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// healthy is the HealthStatus of a driver that reports no adverse
// condition.
const healthy = "Healthy"

// PodVolumeStats returns the last stats of a pod's published volumes in the
// kubelet's summary API types, for a runtime's /stats/summary
// (virtual-kubelet's PodStats.VolumeStats); nil when stats are disabled.
func (vm *VolumeManager) PodVolumeStats(uid types.UID) []statsv1alpha1.VolumeStats {
	if s := vm.manager.Stats(); s != nil {
		return s.PodVolumeStats(uid)
	}
	return nil
}

// VolumeStats returns the last stats and health of every published volume;
// nil when stats are disabled.
func (vm *VolumeManager) VolumeStats() []stats.VolumeStats {
	if s := vm.manager.Stats(); s != nil {
		return s.Volumes()
	}
	return nil
}

// withStats fills in the volumes' last stats.
func (vm *VolumeManager) withStats(vols []VolumeStatus) []VolumeStatus {
	collector := vm.manager.Stats()
	if collector == nil {
		return vols
	}
	for i := range vols {
		s, ok := collector.Volume(volume.Name(vols[i].Name))
		if !ok {
			continue
		}
		st := &VolumeStatsStatus{Time: s.Time, Error: s.Err}
		if u := s.Usage; u != nil {
			st.CapacityBytes, st.AvailableBytes, st.UsedBytes = u.CapacityBytes, u.AvailableBytes, u.UsedBytes
			st.Inodes, st.InodesFree, st.InodesUsed = u.Inodes, u.InodesFree, u.InodesUsed
		}
		if s.HealthSupported {
			st.Health = []HealthStatus{}
			for _, h := range s.Health {
				st.Health = append(st.Health, HealthStatus{Status: string(h.Status), Reason: h.Reason, Message: h.Message})
			}
			if len(st.Health) == 0 {
				st.Health = append(st.Health, HealthStatus{Status: healthy})
			}
		}
		vols[i].Stats = st
	}
	return vols
}
