package reconciler

import (
	"context"
	"errors"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// podChanged recomputes a pod's VolumesReady status from the desired and
// actual states, hands it to the status writer and, the first time all its
// volumes are published, observes how long that took.
//
// Computing and handing over happen under statusMu, so that a status
// computed from older state can never overwrite a newer one.
func (r *Reconciler) podChanged(uid types.UID) {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	p, known := r.cfg.Desired.Pod(uid)
	if !known {
		delete(r.unreadable, uid)
		r.mu.Lock()
		delete(r.ready, uid)
		r.mu.Unlock()
		if r.cfg.Status != nil {
			r.cfg.Status.Forget(uid)
		}
		return
	}
	st := r.podStatus(uid)
	if r.cfg.Status != nil {
		r.cfg.Status.Set(st)
	}
	r.recordUnreadable(p)
	r.mu.Lock()
	first := st.Ready && !r.ready[uid]
	r.ready[uid] = st.Ready
	r.mu.Unlock()
	if first && r.cfg.Ready != nil && !p.FirstSeen.IsZero() {
		r.cfg.Ready.ObservePodReady(p.Info, p.FirstSeen, r.cfg.Now())
	}
}

// PodStatusChanged recomputes a pod's VolumesReady status: for a change of
// the actual state that no step's end reports, such as the progress of a
// long fsGroup ownership change.
func (r *Reconciler) PodStatusChanged(uid types.UID) { r.podChanged(uid) }

// podStatus is the pod's VolumesReady status: ready when every volume it
// wants is published (an uncertain publish is not ready), otherwise blocked
// by the first volume that is not, with the step and error that hold it.
func (r *Reconciler) podStatus(uid types.UID) status.PodVolumesStatus {
	p, _ := r.cfg.Desired.Pod(uid)
	if len(p.Errors) > 0 {
		e := p.Errors[0]
		return status.Blocked(p.Info, status.Blocker{SpecName: e.SpecName, Err: e.Err})
	}
	for _, use := range p.Uses {
		if b, blocked := r.blocker(use.Key(), use.Source, use.Volume.SpecName); blocked {
			return status.Blocked(p.Info, b)
		}
	}
	return r.readyStatus(p)
}

// recordUnreadable records a Warning Event on a pod that has a volume whose
// PVC or PV cannot be read, once per reason: the pod is not ready, and
// its condition says why too. Called under statusMu.
func (r *Reconciler) recordUnreadable(p dsw.Pod) {
	uid := p.UID()
	var e *dsw.VolumeError
	for i := range p.Errors {
		if errors.Is(p.Errors[i].Err, volume.ErrUnreadable) {
			e = &p.Errors[i]
			break
		}
	}
	if e == nil {
		delete(r.unreadable, uid)
		return
	}
	if r.unreadable[uid] == e.Error() {
		return
	}
	r.unreadable[uid] = e.Error()
	if r.cfg.Events != nil {
		r.cfg.Events.VolumeFailed(p.Info, status.Blocker{SpecName: e.SpecName, Err: e.Err})
	}
}

// blocker says what holds one use back, if anything.
func (r *Reconciler) blocker(key volume.PodKey, src volume.Source, specName string) (status.Blocker, bool) {
	b := status.Blocker{SpecName: specName, Source: src}
	ap, _ := r.cfg.Actual.Pod(key)
	if ap.State == volume.Published {
		return b, false
	}
	v, _ := r.cfg.Actual.Volume(key.Volume)
	switch {
	case ap.Progress != nil:
		b.Step, b.Progress = ap.Progress.Step, ap.Progress.String()
	case ap.LastError != nil:
		b.Step, b.Err = ap.LastError.Step, ap.LastError.Err
	case v.LastError != nil:
		b.Step, b.Err = v.LastError.Step, v.LastError.Err
	case !r.cfg.Drivers.Registered(src.Driver):
		b.Step, b.Err = volume.StepStage, volume.ErrDriverNotRegistered
	case src.Inline:
		b.Step = volume.StepPublish
	case !v.Attached && r.cfg.Policies.Get(src.Driver).AttachRequired:
		b.Step = volume.StepWaitForAttach
	case v.Stage != volume.Staged:
		b.Step = volume.StepStage
	default:
		b.Step = volume.StepPublish
	}
	return b, true
}

// recordFailure records an Event on the pods a failed setup step holds
// back: the given pods, or every pod that wants the volume.
func (r *Reconciler) recordFailure(name volume.Name, step volume.Step, err error, pods ...types.UID) {
	if r.cfg.Events == nil {
		return
	}
	if len(pods) == 0 {
		pods = r.cfg.Desired.VolumePods(name)
	}
	for _, uid := range pods {
		use, ok := r.cfg.Desired.PodVolume(volume.PodKey{Volume: name, Pod: uid})
		if !ok {
			continue
		}
		r.cfg.Events.VolumeFailed(use.Volume.Pod, status.Blocker{Step: step, SpecName: use.Volume.SpecName, Source: use.Source, Err: err})
	}
}

func (r *Reconciler) markInUseDirty() {
	if r.cfg.InUse == nil {
		return
	}
	select {
	case r.inUseDirty <- struct{}{}:
	default:
	}
}

// reportInUse recomputes the volumes in use whenever they may have changed:
// the volumes of drivers that need attach (the attach/detach controller
// detaches only those), wanted or still held by the actual state (until
// unstaged it is in use). As the kubelet, which reports the volumes of
// attachable plugins only, volumes of drivers with attachRequired=false
// are left out: nothing detaches them, and reporting them would cost a
// Node status write per volume.
func (r *Reconciler) reportInUse(ctx context.Context) {
	if r.cfg.InUse == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.inUseDirty:
		}
		// One policy lookup per driver and pass: the pass walks every
		// volume, and it runs after every stage and unstage.
		attach := map[string]bool{}
		needsAttach := func(name volume.Name) bool {
			driver := name.Driver()
			if driver == "" {
				return false // inline volumes are never attached
			}
			v, ok := attach[driver]
			if !ok {
				v = r.attachRequired(driver)
				attach[driver] = v
			}
			return v
		}
		var names []volume.Name
		for _, name := range r.cfg.Actual.VolumesInUse() {
			if needsAttach(name) {
				names = append(names, name)
			}
		}
		for _, name := range r.cfg.Desired.Volumes() {
			if needsAttach(name) {
				names = append(names, name)
			}
		}
		r.cfg.InUse.Set(names)
	}
}

// attachRequired says whether the driver's volumes are attached by the
// attach/detach controller; a driver with no CSIDriver object needs attach,
// as in the kubelet.
func (r *Reconciler) attachRequired(driver string) bool {
	return r.cfg.Policies.Get(driver).AttachRequired
}

var _ ActualState = &asw.World{}

// mapSizes counts the entries of the reconciler's maps and queues; for
// tests that check that they do not grow with the pods seen.
func (r *Reconciler) mapSizes() map[string]int {
	r.mu.Lock()
	ready := len(r.ready)
	r.mu.Unlock()
	r.steps.mu.Lock()
	active := len(r.steps.active)
	r.steps.mu.Unlock()
	return map[string]int{"ready": ready, "steps": active, "volumeQueue": r.volumes.Len(), "podQueue": r.pods.Len()}
}
