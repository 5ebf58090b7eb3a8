package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// settleRetry is how soon a volume whose unstage waits for the desired state
// to settle is looked at again.
const settleRetry = 100 * time.Millisecond

// unreadableRecheck is how soon a publish kept for a pod with an unreadable
// volume is looked at again.
const unreadableRecheck = 2 * time.Second

// syncVolume brings one volume's attach and stage state in line: a wanted
// volume is attached (checked) and staged, then its pods are handed to the
// pod queue; a volume nobody wants is unstaged once no publish is left.
func (r *Reconciler) syncVolume(ctx context.Context, name volume.Name) error {
	src, wanted := r.cfg.Desired.Volume(name)
	defer r.volumePodsChanged(name)
	if !wanted {
		return r.tearDownVolume(ctx, name)
	}
	if !r.cfg.Drivers.Registered(src.Driver) {
		// DriverRegistered enqueues the volume when the driver comes.
		return nil
	}
	if src.Inline {
		// Inline volumes are neither attached nor staged.
		for _, uid := range r.cfg.Desired.VolumePods(name) {
			r.pods.Add(volume.PodKey{Volume: name, Pod: uid})
		}
		return nil
	}
	v, _ := r.cfg.Actual.Volume(name)
	if v.Stage == volume.Staged && v.SELinuxContext != src.SELinuxContext {
		// Staged with another SELinux context (for pods that are gone):
		// unstaged once no pod uses it, then attach is checked again and the
		// volume staged for the new pods, as the kubelet unmounts the device
		// first. Unpublishes enqueue the volume.
		if err := r.cfg.Operations.Unstage(ctx, name); err != nil {
			return fmt.Errorf("unstage to change the SELinux context: %w", err)
		}
		v, _ = r.cfg.Actual.Volume(name)
	}
	if !v.Attached {
		if r.mustWaitForInUse(name, src) {
			// Reported enqueues the volume once the Node says it is in use.
			r.markInUseDirty()
			return nil
		}
		if err := r.cfg.Operations.WaitForAttach(ctx, name, src); err != nil {
			return fmt.Errorf("wait for attach: %w", err)
		}
	}
	if v.Stage != volume.Staged {
		err := r.cfg.Operations.Stage(ctx, name, src, r.stageFSGroup(name))
		if errors.Is(err, volume.ErrNotWanted) {
			// Its pods left since this sync read the desired state: the
			// next sync tears it down.
			r.volumes.Add(name)
			return nil
		}
		if err != nil {
			r.recordFailure(name, volume.StepStage, err)
			return fmt.Errorf("stage: %w", err)
		}
		r.markInUseDirty()
	}
	for _, uid := range r.cfg.Desired.VolumePods(name) {
		r.pods.Add(volume.PodKey{Volume: name, Pod: uid})
	}
	return nil
}

// mustWaitForInUse says whether staging must wait until the volume is in
// node.status.volumesInUse: for volumes the attach/detach controller
// attaches, so that it never detaches a volume this node may have staged
// (kubelet #106853 semantics).
func (r *Reconciler) mustWaitForInUse(name volume.Name, src volume.Source) bool {
	if r.cfg.InUse == nil || src.Inline || !r.attachRequired(src.Driver) {
		return false
	}
	return !r.cfg.InUse.Reported(name)
}

// stageFSGroup is the fsGroup sent as volume_mount_group on stage: the
// first wanting pod's, as the kubelet stages for the pod that comes first.
func (r *Reconciler) stageFSGroup(name volume.Name) *int64 {
	for _, uid := range r.cfg.Desired.VolumePods(name) {
		if use, ok := r.cfg.Desired.PodVolume(volume.PodKey{Volume: name, Pod: uid}); ok {
			return use.Volume.FSGroup
		}
	}
	return nil
}

func (r *Reconciler) tearDownVolume(ctx context.Context, name volume.Name) error {
	v, known := r.cfg.Actual.Volume(name)
	if !known || v.External || !r.synced() {
		// A stage a container orchestrator asked for through the front
		// endpoint is that caller's to tear down.
		return nil
	}
	if pubs := r.cfg.Actual.Publishers(name); len(pubs) > 0 {
		// Unpublish first; the last unpublish enqueues the volume again.
		for _, uid := range pubs {
			r.pods.Add(volume.PodKey{Volume: name, Pod: uid})
		}
		return nil
	}
	if r.cfg.Settled != nil && !r.cfg.Settled() {
		// A pod not resolved yet may want the volume: look again shortly.
		r.volumes.AddAfter(name, settleRetry)
		return nil
	}
	if _, wanted := r.cfg.Desired.Volume(name); wanted {
		// Wanted again meanwhile.
		r.volumes.Add(name)
		return nil
	}
	if err := r.cfg.Operations.Unstage(ctx, name); err != nil {
		return fmt.Errorf("unstage %s: %w", name, err)
	}
	r.markInUseDirty()
	return nil
}

// syncPodVolume brings one pod's use of a volume in line: a wanted use of a
// staged volume is published; a use nobody wants any more is unpublished.
func (r *Reconciler) syncPodVolume(ctx context.Context, key volume.PodKey) error {
	use, wanted := r.cfg.Desired.PodVolume(key)
	defer r.podChanged(key.Pod)
	if !wanted {
		if p, known := r.cfg.Actual.Pod(key); !known || p.External || !r.synced() {
			// A publish a container orchestrator asked for through the
			// front endpoint is that caller's to tear down.
			return nil
		}
		if r.unreadableIn(key.Pod) {
			// The pod is still here but one of its volumes could not be
			// read (after a restart, its use is not in the desired state
			// yet): this publish may be that volume's. It stays until the
			// pod resolves again (its use reappears, or is gone for good)
			// or leaves. Neither enqueues this key (the desired state
			// never had it), so it is looked at again after a while.
			r.pods.AddAfter(key, unreadableRecheck)
			return nil
		}
		if r.cfg.Holds != nil {
			if _, held := r.cfg.Holds.Held(key.Pod); held {
				// Its containers may still run: no unpublish and no retry
				// until the runtime releases the pod (PodReleased).
				return nil
			}
		}
		if err := r.cfg.Operations.Unpublish(ctx, key); err != nil {
			return fmt.Errorf("unpublish %s: %w", key, err)
		}
		r.volumes.Add(key.Volume) // it may be unstaged now
		return nil
	}
	if p, _ := r.cfg.Actual.Pod(key); p.State == volume.Published {
		return nil
	}
	if v, _ := r.cfg.Actual.Volume(key.Volume); (v.Stage != volume.Staged || v.SELinuxContext != use.Source.SELinuxContext) && !use.Source.Inline {
		// The volume queue stages it (again, with this pod's SELinux
		// context) and hands this key back.
		r.volumes.Add(key.Volume)
		return nil
	}
	err := r.cfg.Operations.Publish(ctx, key, use.Source, use.Volume)
	if errors.Is(err, volume.ErrNotWanted) {
		// The pod left since this sync read the desired state.
		r.pods.Add(key)
		return nil
	}
	if err != nil {
		r.recordFailure(key.Volume, volume.StepPublish, err, key.Pod)
		return fmt.Errorf("publish %s: %w", key, err)
	}
	return r.expandAfterPublish(ctx, key, use)
}

// unreadableIn tells whether the pod is in the desired state with a volume
// whose PVC or PV could not be read.
func (r *Reconciler) unreadableIn(uid types.UID) bool {
	p, ok := r.cfg.Desired.Pod(uid)
	if !ok {
		return false
	}
	for _, e := range p.Errors {
		if errors.Is(e.Err, volume.ErrUnreadable) {
			return true
		}
	}
	return false
}

// knownVolumes is every volume the desired or the actual state knows.
func (r *Reconciler) knownVolumes() []volume.Name {
	names := append(r.cfg.Desired.Volumes(), r.cfg.Actual.VolumeNames()...)
	slices.Sort(names)
	return slices.Compact(names)
}

// podKeysOf is every pod key of the volume in the desired or actual state.
func (r *Reconciler) podKeysOf(name volume.Name) []volume.PodKey {
	uids := append(r.cfg.Desired.VolumePods(name), r.cfg.Actual.Publishers(name)...)
	slices.Sort(uids)
	uids = slices.Compact(uids)
	keys := make([]volume.PodKey, 0, len(uids))
	for _, uid := range uids {
		keys = append(keys, volume.PodKey{Volume: name, Pod: uid})
	}
	return keys
}

func (r *Reconciler) driverOf(name volume.Name) string {
	if src, ok := r.cfg.Desired.Volume(name); ok {
		return src.Driver
	}
	v, _ := r.cfg.Actual.Volume(name)
	return v.Driver
}

// volumePodsChanged refreshes the status of every pod that wants the volume.
func (r *Reconciler) volumePodsChanged(name volume.Name) {
	for _, uid := range r.cfg.Desired.VolumePods(name) {
		r.podChanged(uid)
	}
}
