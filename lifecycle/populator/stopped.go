package populator

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// stopSignals are the pods whose containers a runtime said have stopped
// (Populator.ContainersStopped). With Config.WaitForContainersStopped such a
// signal, not a deletionTimestamp, is what lets a running pod's volumes go:
// the kubelet, too, unmounts only once the containers that use the mounts
// are gone.
type stopSignals struct {
	mu      sync.Mutex
	stopped map[types.UID]struct{}
}

// ContainersStopped records that the pod's containers have stopped and will
// not run again, and re-resolves the pod: it leaves the desired state, and
// its volumes are torn down. A signal for a pod this node does not have is
// dropped here when the pod is resolved; the lifecycle keeps the runtime's
// word for such a pod's volumes apart (lifecycle/runtimepods). It never
// blocks.
func (p *Populator) ContainersStopped(uid types.UID) {
	p.stops.mu.Lock()
	if p.stops.stopped == nil {
		p.stops.stopped = map[types.UID]struct{}{}
	}
	p.stops.stopped[uid] = struct{}{}
	p.stops.mu.Unlock()
	p.queue.Add(uid)
}

// runtimeSignal says whether a pod that is not terminal leaves the desired
// state because of the runtime's signal; decided is false when no runtime
// signals (Config.WaitForContainersStopped unset) and a signal never came.
func (p *Populator) runtimeSignal(uid types.UID) (leaves, decided bool) {
	p.stops.mu.Lock()
	_, stopped := p.stops.stopped[uid]
	p.stops.mu.Unlock()
	return stopped, stopped || p.cfg.WaitForContainersStopped
}

// forgetSignal drops the signal of a pod that left the node.
func (p *Populator) forgetSignal(uid types.UID) {
	p.stops.mu.Lock()
	delete(p.stops.stopped, uid)
	p.stops.mu.Unlock()
}

// SourcePod returns the pod as the Source has it (the API server's cache of
// the node's pods, or the manifests): false once it is gone from there.
// The pod is shared with the cache: never modify it.
func (p *Populator) SourcePod(uid types.UID) (*corev1.Pod, bool) { return p.cfg.Source.Pod(uid) }
