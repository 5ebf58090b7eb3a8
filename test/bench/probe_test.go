package bench_test

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// readyProbe is the Manager's extra ReadyObserver (lifecycle.Config's
// Reconciler.Ready, told of each pod besides the metrics): it keeps every
// pod-ready observation until taken.
type readyProbe struct {
	// mu guards obs.
	mu  sync.Mutex
	obs []readyObservation
	// notify gets a token at each observation (dropped when one is pending).
	notify chan struct{}
}

var _ reconciler.ReadyObserver = &readyProbe{}

func newReadyProbe() *readyProbe { return &readyProbe{notify: make(chan struct{}, 1)} }

// readyObservation is one ReadyObserver call.
type readyObservation struct {
	pod types.UID
	// seen is when the populator first saw the pod; at is when all its
	// volumes were published (the reconciler's clock).
	seen, at time.Time
}

// latency is what the pod-ready histogram records: first seen → ready.
func (o readyObservation) latency() time.Duration { return o.at.Sub(o.seen) }

// ObservePodReady records one observation.
func (p *readyProbe) ObservePodReady(pod volume.PodInfo, firstSeen, ready time.Time) {
	p.mu.Lock()
	p.obs = append(p.obs, readyObservation{pod: pod.UID, seen: firstSeen, at: ready})
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// count is the number of observations not yet taken.
func (p *readyProbe) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.obs)
}

// take returns the observations so far and forgets them.
func (p *readyProbe) take() []readyObservation {
	p.mu.Lock()
	defer p.mu.Unlock()
	obs := p.obs
	p.obs = nil
	return obs
}
