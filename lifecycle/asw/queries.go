package asw

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Volume is a copy of what the World records about one volume, without its
// pods.
type Volume struct {
	// Name is the volume's name.
	Name volume.Name
	volume.ID
	// Attached says the VolumeAttachment was found attached (or the driver
	// needs none); PublishContext is its attachmentMetadata.
	Attached       bool
	PublishContext map[string]string
	// Stage is the stage state and StagingPath the staging_target_path.
	Stage       volume.StageState
	StagingPath string
	// External marks a stage done for a container orchestrator through the
	// front endpoint (see StageOutcome.External).
	External bool
	// Reconstructed marks a stage state found at start-up and not proven since.
	Reconstructed bool
	// SELinuxContext is the context= the volume was staged with.
	SELinuxContext string
	// Migrated marks an in-tree volume translated to CSI, as a stage or
	// publish recorded it (not known for a volume reconstructed at start).
	Migrated bool
	// LastError is the volume's last error (attach, stage or unstage), nil if none.
	LastError *Failure
}

// Pod is a copy of what the World records about one pod's publish of a
// volume.
type Pod struct {
	// Key names the volume and the pod.
	Key volume.PodKey
	// State is the publish state and TargetPath the target_path.
	State      volume.PublishState
	TargetPath string
	// External marks a publish done for a container orchestrator through
	// the front endpoint (see PublishOutcome.External).
	External bool
	// Reconstructed marks a publish state found at start-up and not proven since.
	Reconstructed bool
	// LastError is the pod's last publish or unpublish error, nil if none.
	LastError *Failure
	// Progress is the progress of a long setup step running on the pod's
	// volume (the fsGroup ownership change), nil if none.
	Progress *Progress
	// Presentation is how the volume is handed to the pod's containers
	// (block device path, SELinux context), as the last successful publish
	// (or reconstruction) recorded it.
	Presentation volume.Presentation
}

// VolumeStatus is one volume of a Snapshot, with its pods sorted by UID.
type VolumeStatus struct {
	Volume
	Pods []Pod
}

func (v *volumeEntry) copy(name volume.Name) Volume {
	return Volume{
		Name:           name,
		ID:             v.id,
		Attached:       v.attached,
		PublishContext: maps.Clone(v.publishContext),
		Stage:          v.stage,
		StagingPath:    v.stagingPath,
		External:       v.external,
		Reconstructed:  v.reconstructed,
		SELinuxContext: v.seLinuxContext,
		Migrated:       v.migrated,
		LastError:      copyFailure(v.lastErr),
	}
}

func (p *podEntry) copy(key volume.PodKey) Pod {
	return Pod{
		Key:           key,
		State:         p.state,
		TargetPath:    p.targetPath,
		External:      p.external,
		Reconstructed: p.reconstructed,
		LastError:     copyFailure(p.lastErr),
		Progress:      copyProgress(p.progress),
		Presentation:  p.presentation,
	}
}

func copyProgress(p *Progress) *Progress {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

func copyFailure(f *Failure) *Failure {
	if f == nil {
		return nil
	}
	c := *f
	return &c
}

// Volume returns what is recorded about name.
func (w *World) Volume(name volume.Name) (Volume, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	v, ok := w.volumes[name]
	if !ok {
		return Volume{}, false
	}
	return v.copy(name), true
}

// Pod returns what is recorded about one pod's publish of a volume.
func (w *World) Pod(key volume.PodKey) (Pod, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	p, ok := w.byPod[key.Pod][key.Volume]
	if !ok {
		return Pod{}, false
	}
	return p.copy(key), true
}

// PodVolumes returns every entry of one pod, in any state, sorted by
// volume name: what must be torn down when the pod goes. Its cost is
// proportional to the pod's volumes.
func (w *World) PodVolumes(pod types.UID) []Pod {
	w.mu.RLock()
	defer w.mu.RUnlock()
	byVolume := w.byPod[pod]
	out := make([]Pod, 0, len(byVolume))
	for _, name := range slices.Sorted(maps.Keys(byVolume)) {
		out = append(out, byVolume[name].copy(volume.PodKey{Volume: name, Pod: pod}))
	}
	return out
}

// Publishers returns, sorted, the pods whose publish of name is present or
// possibly present (Published or PublishUncertain): the pods that must be
// unpublished before the volume may be unstaged, and that count as "in use
// by another pod" for ReadWriteOncePod.
func (w *World) Publishers(name volume.Name) []types.UID {
	w.mu.RLock()
	defer w.mu.RUnlock()
	v, ok := w.volumes[name]
	if !ok {
		return nil
	}
	return publishers(v)
}

// publishers implements Publishers; mu must be held.
func publishers(v *volumeEntry) []types.UID {
	var out []types.UID
	for uid, p := range v.pods {
		if p.state != volume.NotPublished {
			out = append(out, uid)
		}
	}
	slices.Sort(out)
	return out
}

// maxNamed bounds how many pods an ErrInUse message names.
const maxNamed = 5

// MayUnstage is the one rule that decides whether a volume may be unstaged
// (lifecycle/operations serializes the steps around it). It returns nil
// when no pod's publish of the volume is present or possibly present, and
// otherwise an
// error wrapping volume.ErrInUse that names those pods:
//
//   - Published blocks: a pod uses the staged volume.
//   - PublishUncertain blocks: the publish may have mounted from the staging
//     path (or be running still in the driver), so it must be unpublished
//     first — whether it came from a timeout or from reconstruction.
//   - NotPublished does not block: the entry only keeps a failed publish's
//     error, and nothing was mounted.
//   - A volume the World does not know may be unstaged: nothing blocks it.
//
// Publishes that are pending (in flight) are not recorded here.
// lifecycle/operations makes them visible by ordering: stage and unstage
// hold a volume's lock exclusively while publishes and unpublishes hold it
// shared, and every step records its outcome before it releases the lock,
// so an unstage that holds the lock sees the outcome of every publish that
// started before it, and no publish starts until it is done. The stage
// state does not matter: an uncertain or absent stage is unstaged too.
func (w *World) MayUnstage(name volume.Name) error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	v, ok := w.volumes[name]
	if !ok {
		return nil
	}
	pods := publishers(v)
	if len(pods) == 0 {
		return nil
	}
	named := make([]string, 0, maxNamed)
	for _, uid := range pods[:min(len(pods), maxNamed)] {
		named = append(named, string(uid))
	}
	more := ""
	if len(pods) > maxNamed {
		more = fmt.Sprintf(" and %d more", len(pods)-maxNamed)
	}
	return fmt.Errorf("%w: %s is still published for pods %s%s", volume.ErrInUse, name, strings.Join(named, ", "), more)
}

// VolumeNames returns the names of every recorded volume, sorted.
func (w *World) VolumeNames() []volume.Name {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return slices.Sorted(maps.Keys(w.volumes))
}

// VolumesInUse returns, sorted, the volumes to report in the node's
// status.volumesInUse from the actual side: every recorded volume of a
// PersistentVolume, in whatever state, since the attach/detach controller
// must not detach a volume that may still be staged. (The kubelet adds the
// desired side; that is the reconciler's to merge.) Inline volumes are never
// attached and are left out.
func (w *World) VolumesInUse() []volume.Name {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]volume.Name, 0, len(w.volumes))
	for name := range w.volumes {
		if !name.IsInline() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Snapshot returns every volume with its pods, sorted by name, for
// `csi-volmgr status` and the metrics: a consistent copy taken under one
// lock.
func (w *World) Snapshot() []VolumeStatus {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]VolumeStatus, 0, len(w.volumes))
	for _, name := range slices.Sorted(maps.Keys(w.volumes)) {
		v := w.volumes[name]
		vs := VolumeStatus{Volume: v.copy(name), Pods: make([]Pod, 0, len(v.pods))}
		for _, uid := range slices.Sorted(maps.Keys(v.pods)) {
			vs.Pods = append(vs.Pods, v.pods[uid].copy(volume.PodKey{Volume: name, Pod: uid}))
		}
		out = append(out, vs)
	}
	return out
}
