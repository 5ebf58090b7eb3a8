package lifecycle

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/runtimepods"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// newRuntimePods builds the runtime's word on its pods
// (Config.WaitForContainersStopped) and its gauge. It reads the populator
// and tells the reconciler, which exist by the time it is asked or tells.
func (m *Manager) newRuntimePods(ctx context.Context) (*runtimepods.Pods, error) {
	p, err := runtimepods.New(runtimepods.Config{
		States:    runtimeStates{m},
		Synced:    func() bool { return m.pop.HasSynced() },
		OnRelease: m.podReleased,
		Logger:    klog.FromContext(ctx).WithName("runtimepods"),
	})
	if err != nil {
		return nil, err
	}
	if err := metrics.RegisterAwaitingRuntime(m.cfg.Registerer, p.Awaiting); err != nil {
		return nil, err
	}
	return p, nil
}

// podReleased starts the teardown of a pod the runtime released.
func (m *Manager) podReleased(uid types.UID) {
	held := m.world.PodVolumes(uid)
	keys := make([]volume.PodKey, 0, len(held))
	for _, p := range held {
		keys = append(keys, p.Key)
	}
	m.rec.PodReleased(keys)
}

// runtimeStates is what runtimepods reads of the two states.
type runtimeStates struct{ m *Manager }

func (s runtimeStates) Wanted(uid types.UID) bool {
	_, ok := s.m.desire.Pod(uid)
	return ok
}

func (s runtimeStates) Published(uid types.UID) bool {
	for _, p := range s.m.world.PodVolumes(uid) {
		if !p.External {
			return true
		}
	}
	return false
}

func (s runtimeStates) Unwanted() []types.UID {
	seen := map[types.UID]bool{}
	var out []types.UID
	for _, v := range s.m.world.Snapshot() {
		for _, p := range v.Pods {
			uid := p.Key.Pod
			if p.External || seen[uid] {
				continue
			}
			seen[uid] = true
			if !s.Wanted(uid) {
				out = append(out, uid)
			}
		}
	}
	return out
}
