package reconciler

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// VolumeHealth says whether a driver reports a published volume unhealthy;
// *stats.Collector implements it. Nil reports none.
type VolumeHealth interface {
	// Unhealthy returns, for a volume a driver reports adverse health
	// conditions of, a message that names them.
	Unhealthy(name volume.Name) (message string, unhealthy bool)
}

// readyStatus is the status of a pod whose volumes are all published:
// Ready, with the first unhealthy volume named in the message.
func (r *Reconciler) readyStatus(p dsw.Pod) status.PodVolumesStatus {
	if r.cfg.Health != nil {
		for _, use := range p.Uses {
			if msg, bad := r.cfg.Health.Unhealthy(use.Name); bad {
				return status.ReadyButUnhealthy(p.Info, msg)
			}
		}
	}
	return status.Ready(p.Info)
}

// HealthChanged recomputes the condition of pods whose volume's health
// changed. It does not block on the API.
func (r *Reconciler) HealthChanged(pods []types.UID) {
	for _, uid := range pods {
		r.podChanged(uid)
	}
}
