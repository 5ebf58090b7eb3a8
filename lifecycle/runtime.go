package lifecycle

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// PodObserver is told of every change of a pod's volumes, for a runtime
// that waits for them (volumemanager's WaitForAttachAndMount and
// WaitForUnmount). Its methods run on the reconciler's goroutines and must
// not block.
type PodObserver interface {
	// PodVolumesChanged gives the pod's latest VolumesReady status: ready,
	// or what blocks it. It is called each time a step of one of the pod's
	// volumes ran or the pod's desired state changed.
	PodVolumesChanged(s status.PodVolumesStatus)
	// PodVolumesLeaving says the pod left the desired state: it is called
	// when it left and after each teardown step of its volumes; the pod's
	// volumes are all torn down once Manager.PodVolumes returns none.
	PodVolumesLeaving(uid types.UID)
}

// observedStatus is the mode's StatusWriter that also tells the
// PodObserver.
type observedStatus struct {
	next     reconciler.StatusWriter
	observer PodObserver
}

func (o observedStatus) Set(s status.PodVolumesStatus) {
	if o.next != nil {
		o.next.Set(s)
	}
	o.observer.PodVolumesChanged(s)
}

func (o observedStatus) Forget(uid types.UID) {
	if o.next != nil {
		o.next.Forget(uid)
	}
	o.observer.PodVolumesLeaving(uid)
}

// observe puts the PodObserver, if any, behind the mode's status writer.
func observe(w reconciler.StatusWriter, obs PodObserver) reconciler.StatusWriter {
	if obs == nil {
		return w
	}
	return observedStatus{next: w, observer: obs}
}

// DesiredPod returns the pod's desired state: the volumes its containers
// use, as resolved, and those that could not be resolved. False when the
// pod is not (or no longer) in the desired state.
func (m *Manager) DesiredPod(uid types.UID) (dsw.Pod, bool) { return m.desire.Pod(uid) }

// PodVolumes returns every publish of the pod the actual state holds, in
// any state: none once its volumes are torn down.
func (m *Manager) PodVolumes(uid types.UID) []asw.Pod { return m.world.PodVolumes(uid) }

// ContainersStopped tells the lifecycle that the pod's containers have
// stopped and will not run again: its volumes may be torn down. With
// Config.WaitForContainersStopped this, a running-pods report without the
// pod (RunningPods) or the pod's terminal phase are what tear a pod's
// volumes down; a pod that merely left the API server keeps them. The
// signal counts for a pod the API server no longer has, and for one found
// only on disk at start.
func (m *Manager) ContainersStopped(uid types.UID) {
	if m.holds != nil {
		m.holds.ContainersStopped(uid)
	}
	m.pop.ContainersStopped(uid)
}

// SourcePod returns the pod as the agent's source of pods has it (the API
// server's cache of the node's pods, or the manifests in standalone mode);
// false once it is gone from there (deleted, force-deleted, garbage
// collected, its manifest removed) or before it is cached. The pod is
// shared with the cache: never modify it.
func (m *Manager) SourcePod(uid types.UID) (*corev1.Pod, bool) { return m.pop.SourcePod(uid) }

// SourcesSynced tells whether the pods of the node have been listed (the
// API server's or the manifests'): before, a pod missing from SourcePod
// may be one not read yet, not one gone.
func (m *Manager) SourcesSynced() bool { return m.pop.HasSynced() }

// RunningPods gives the runtime's report of the pods whose containers it
// still runs (Config.WaitForContainersStopped; ignored otherwise): a pod
// that left the desired state before the report and is not in it — or
// was found on disk at start and is not in it — has its volumes torn down.
func (m *Manager) RunningPods(uids []types.UID) {
	if m.holds != nil {
		m.holds.Running(uids)
	}
}

// BeginRunningPods dates a report before the runtime lists its pods: a pod
// that leaves the desired state after this call may have started after the
// list was taken, so the report (the returned function) does not release
// it.
func (m *Manager) BeginRunningPods() func(uids []types.UID) {
	mark := m.RunningPodsMark()
	return func(uids []types.UID) {
		// A mark of this Manager's own is never later than the latest.
		_ = m.RunningPodsAsOf(mark, uids)
	}
}

// RunningPodsMark is BeginRunningPods for a runtime that reports in
// another call (the HTTP API): it returns the mark that dates the report —
// the number of pods that left the desired state so far, never smaller
// than a mark returned before — to give RunningPodsAsOf with the list
// taken after it. 0 without Config.WaitForContainersStopped.
func (m *Manager) RunningPodsMark() uint64 {
	if m.holds == nil {
		return 0
	}
	return m.holds.Mark()
}

// ErrMarkNotIssued is returned by RunningPodsAsOf for a mark later than any
// RunningPodsMark returned: it would date the report after pods that
// left — and may have started — after the list was taken.
var ErrMarkNotIssued = errors.New("the mark is later than any the agent issued")

// RunningPodsAsOf records the runtime's report of the pods it still runs,
// listed after RunningPodsMark returned mark: a pod that left the desired
// state after the mark is not released by it, so that a report that was
// on its way while the pod started and was force-deleted keeps its
// volumes. A report older than the latest one is dropped. It fails with
// ErrMarkNotIssued, and records nothing, for a mark never issued.
func (m *Manager) RunningPodsAsOf(mark uint64, uids []types.UID) error {
	if m.holds == nil {
		if mark != 0 {
			return ErrMarkNotIssued
		}
		return nil
	}
	if mark > m.holds.Mark() {
		return ErrMarkNotIssued
	}
	m.holds.RunningAsOf(mark, uids)
	return nil
}

// AwaitingRuntime says whether the pod left the desired state and its
// volumes stay until its runtime says its containers stopped, and why.
// A runtime that never reports keeps them forever: nothing is unmounted,
// and the pod is counted in csi_volmgr_pods_awaiting_runtime.
func (m *Manager) AwaitingRuntime(uid types.UID) (reason string, awaiting bool) {
	if m.holds == nil {
		return "", false
	}
	return m.holds.Waiting(uid)
}

// PodsAwaitingRuntime returns the pods AwaitingRuntime holds, unsorted.
func (m *Manager) PodsAwaitingRuntime() []types.UID {
	if m.holds == nil {
		return nil
	}
	return m.holds.WaitingPods()
}
