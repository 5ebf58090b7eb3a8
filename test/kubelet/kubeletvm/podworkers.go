package kubeletvm

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/volumemanager"
)

// The kubelet's pod worker timing (pkg/kubelet/kubelet.go, pod_workers.go).
const (
	// backOffPeriod is how long a pod worker waits after a failed sync.
	backOffPeriod = 10 * time.Second
	// resyncJitter and backOffJitter are the jitter factors of the
	// resync interval and of the back-off.
	resyncJitter  = 0.5
	backOffJitter = 0.5
)

// podWorkers stands in for the kubelet's pod workers
// (pkg/kubelet/pod_workers.go, unexported, driving the container runtime) as
// far as the volume manager sees them. Like the kubelet's, it runs one
// goroutine per pod:
//
//   - sync (the kubelet's SyncPod): WaitForAttachAndMount(pod), which marks
//     the pod for reprocessing by the populator and polls every 300 ms
//     until all its volumes are mounted; then again after the kubelet's
//     resync interval (SyncFrequency, 1 min, jittered by 0.5, as
//     completeWork requeues it), or right away when the pod is updated; after
//     an error, after backOffPeriod (10 s) jittered by 0.5;
//   - termination, once the pod is deleted or removed from the config: the
//     sync in flight is canceled (as the kubelet cancels it), there are no
//     containers to stop (SyncTerminatingPod), the pod is terminated, and
//     the worker waits in WaitForUnmount until the volume manager unmounted
//     every volume (SyncTerminatedPod).
//
// It is the volume manager's PodStateProvider with the kubelet's semantics:
// a known pod's containers are terminating once termination was requested
// and its runtime is removed once it is terminated; an unknown pod counts as
// both once the pods are synced (the first housekeeping after all sources
// are ready). Housekeeping forgets finished workers of removed pods.
//
// What the kubelet does in SyncPod besides the volume wait (status,
// cgroups, images, containers) is not done: there is no runtime.
type podWorkers struct {
	vm     volumemanager.VolumeManager
	resync time.Duration
	logger klog.Logger

	// mu guards the fields below and every podWorker's fields.
	mu      sync.Mutex
	workers map[types.UID]*podWorker
	// synced is the kubelet's podsSynced.
	synced bool
	wg     sync.WaitGroup
}

// podWorker is one pod's worker state.
type podWorker struct {
	pod                  *corev1.Pod
	terminationRequested bool
	terminated           bool
	finished             bool
	// removed is set when the pod left the config (REMOVE).
	removed bool
	// wake gets a token when the pod changed.
	wake       chan struct{}
	cancelSync context.CancelFunc
	rec        PodRecord
}

// PodRecord is what the pod worker saw of one pod, with this process's
// clock.
type PodRecord struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// Added is when the sync loop handed the pod to its worker (ADD).
	Added time.Time `json:"added"`
	// Ready is when WaitForAttachAndMount first returned nil: the moment
	// the kubelet would go on to start the pod's containers.
	Ready time.Time `json:"ready,omitzero"`
	// Syncs counts the WaitForAttachAndMount calls.
	Syncs     int    `json:"syncs"`
	LastError string `json:"lastError,omitempty"`
	// TerminationRequested is when the pod was deleted or removed.
	TerminationRequested time.Time `json:"terminationRequested,omitzero"`
	// Unmounted is when WaitForUnmount returned nil.
	Unmounted time.Time `json:"unmounted,omitzero"`
}

func newPodWorkers(resync time.Duration, logger klog.Logger) *podWorkers {
	return &podWorkers{resync: resync, logger: logger, workers: map[types.UID]*podWorker{}}
}

// update hands a new or changed pod to its worker (the kubelet's
// UpdatePod with SyncPodCreate or SyncPodUpdate); a pod with a deletion
// timestamp is terminated.
func (p *podWorkers) update(ctx context.Context, pod *corev1.Pod, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.workers[pod.UID]
	if !ok {
		w = &podWorker{pod: pod, wake: make(chan struct{}, 1),
			rec: PodRecord{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Added: now}}
		p.workers[pod.UID] = w
		p.wg.Go(func() { p.run(ctx, w) })
	} else {
		w.pod = pod
		poke(w.wake)
	}
	if pod.DeletionTimestamp != nil {
		p.requestTerminationLocked(w, now)
	}
}

// remove terminates the worker of a pod that left the config.
func (p *podWorkers) remove(pod *corev1.Pod, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.workers[pod.UID]
	if !ok {
		return
	}
	w.removed = true
	p.requestTerminationLocked(w, now)
}

func (p *podWorkers) requestTerminationLocked(w *podWorker, now time.Time) {
	if w.terminationRequested {
		return
	}
	w.terminationRequested = true
	w.rec.TerminationRequested = now
	if w.cancelSync != nil {
		w.cancelSync()
	}
	poke(w.wake)
}

// run is one pod's worker goroutine.
func (p *podWorkers) run(ctx context.Context, w *podWorker) {
	for {
		p.mu.Lock()
		if w.terminationRequested {
			p.mu.Unlock()
			break
		}
		pod := w.pod
		syncCtx, cancel := context.WithCancel(ctx)
		w.cancelSync = cancel
		p.mu.Unlock()

		err := p.vm.WaitForAttachAndMount(syncCtx, pod)
		cancel()
		now := time.Now()
		p.mu.Lock()
		w.cancelSync = nil
		w.rec.Syncs++
		if err == nil && w.rec.Ready.IsZero() {
			w.rec.Ready = now
		}
		if err != nil {
			w.rec.LastError = err.Error()
		}
		terminating := w.terminationRequested
		p.mu.Unlock()
		if terminating {
			break
		}
		delay := wait.Jitter(p.resync, resyncJitter)
		if err != nil {
			p.logger.Info("Pod sync failed, backing off", "pod", klog.KObj(pod), "err", err)
			delay = wait.Jitter(backOffPeriod, backOffJitter)
		}
		if !sleep(ctx, delay, w.wake) {
			return
		}
	}

	// SyncTerminatingPod: no containers to stop.
	p.mu.Lock()
	w.terminated = true
	pod := w.pod
	p.mu.Unlock()

	// SyncTerminatedPod: wait until the volume manager unmounted the
	// pod's volumes.
	for {
		err := p.vm.WaitForUnmount(ctx, pod)
		if err == nil {
			break
		}
		p.logger.Info("Waiting for volumes to unmount failed, backing off", "pod", klog.KObj(pod), "err", err)
		if !sleep(ctx, wait.Jitter(backOffPeriod, backOffJitter), nil) {
			return
		}
	}
	p.mu.Lock()
	w.finished = true
	w.rec.Unmounted = time.Now()
	p.mu.Unlock()
}

// ShouldPodContainersBeTerminating is the kubelet's semantics (volume
// manager's PodStateProvider).
func (p *podWorkers) ShouldPodContainersBeTerminating(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w, ok := p.workers[uid]; ok {
		return w.terminationRequested
	}
	return p.synced
}

// ShouldPodRuntimeBeRemoved is the kubelet's semantics.
func (p *podWorkers) ShouldPodRuntimeBeRemoved(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w, ok := p.workers[uid]; ok {
		return w.terminated
	}
	return p.synced
}

// known reports whether uid has a worker that has not been forgotten.
func (p *podWorkers) known(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.workers[uid]
	return ok
}

// syncKnownPods is the pod workers' part of housekeeping (the kubelet's
// SyncKnownPods): the pods are synced from now on, and the finished
// workers of pods removed from the config are forgotten.
func (p *podWorkers) syncKnownPods() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.synced = true
	for uid, w := range p.workers {
		if w.finished && w.removed {
			delete(p.workers, uid)
		}
	}
}

// records copies the records of the known pods.
func (p *podWorkers) records() []PodRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PodRecord, 0, len(p.workers))
	for _, w := range p.workers {
		out = append(out, w.rec)
	}
	return out
}

// wait waits for every worker goroutine to return (after ctx ended).
func (p *podWorkers) wait() { p.wg.Wait() }

// poke puts a token into ch unless one is pending.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sleep waits for d, a token on wake (nil: none) or the end of ctx, and
// reports false if ctx ended.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-t.C:
	}
	return true
}
