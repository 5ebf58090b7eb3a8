package asw

import (
	"maps"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Failure is the last error of a step, kept until a later success clears it.
type Failure struct {
	// Step is the step that failed.
	Step volume.Step
	// Err is its error.
	Err error
	// Time is when it was recorded; the error's age is now minus Time.
	Time time.Time
}

// StageOutcome is the result of a stage or unstage step.
type StageOutcome struct {
	// Step is volume.StepStage or volume.StepUnstage.
	Step volume.Step
	// State is the stage state the step left.
	State volume.StageState
	// StagingPath is the staging_target_path used.
	StagingPath string
	// External marks a stage a container orchestrator asked for through the
	// front endpoint, at a staging path it chose: the volume's stage is that
	// caller's to tear down, never the reconciler's.
	External bool
	// SELinuxContext is the context= the volume was staged with; recorded
	// with State Staged.
	SELinuxContext string
	// Migrated marks an in-tree volume translated to CSI (volume.Source's
	// Migrated); the mark stays with the volume until it is forgotten.
	Migrated bool
	// Err is the step's error; nil for success.
	Err error
}

// PublishOutcome is the result of a publish or unpublish step.
type PublishOutcome struct {
	// Step is volume.StepPublish or volume.StepUnpublish.
	Step volume.Step
	// State is the publish state the step left.
	State volume.PublishState
	// TargetPath is the target_path used.
	TargetPath string
	// External marks a publish a container orchestrator asked for through
	// the front endpoint, at a target path it chose: it is that caller's to
	// tear down, never the reconciler's.
	External bool
	// Presentation, when set, is how the published volume is handed to the
	// pod's containers (block device, SELinux context); nil keeps what was
	// recorded.
	Presentation *volume.Presentation
	// Migrated marks an in-tree volume translated to CSI, as in
	// StageOutcome.
	Migrated bool
	// Err is the step's error; nil for success.
	Err error
}

// World is the actual state of world. The zero value is not usable; make
// one with New. All methods are safe for concurrent use; they take mu and
// never call out while holding it.
type World struct {
	now func() time.Time

	// mu guards volumes and byPod, and everything reachable from them.
	mu sync.RWMutex
	// volumes holds every volume the agent acted on or found at start-up.
	volumes map[volume.Name]*volumeEntry
	// byPod indexes the pod entries of volumes by pod UID; the entries are
	// shared with volumeEntry.pods. Invariant: a pod entry is in byPod[uid]
	// exactly when it is in volumes[name].pods.
	byPod map[types.UID]map[volume.Name]*podEntry
}

type volumeEntry struct {
	id             volume.ID
	attached       bool
	publishContext map[string]string
	stage          volume.StageState
	stagingPath    string
	external       bool
	reconstructed  bool
	seLinuxContext string
	migrated       bool
	lastErr        *Failure
	pods           map[types.UID]*podEntry
}

type podEntry struct {
	state         volume.PublishState
	targetPath    string
	external      bool
	reconstructed bool
	lastErr       *Failure
	progress      *Progress
	presentation  volume.Presentation
}

// Options configures a World.
type Options struct {
	// Now returns the current time, for error timestamps; nil means time.Now.
	Now func() time.Time
}

// New returns an empty World.
func New(opts Options) *World {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &World{
		now:     now,
		volumes: map[volume.Name]*volumeEntry{},
		byPod:   map[types.UID]map[volume.Name]*podEntry{},
	}
}

// volume returns the entry of name, creating it with id. An existing
// entry's id is updated from a non-empty id. mu must be held for writing.
func (w *World) volume(name volume.Name, id volume.ID) *volumeEntry {
	v, ok := w.volumes[name]
	if !ok {
		v = &volumeEntry{id: id, pods: map[types.UID]*podEntry{}}
		w.volumes[name] = v
		return v
	}
	if id.Driver != "" {
		v.id = id
	}
	return v
}

// failure returns the Failure for err at step, nil for a nil err.
func (w *World) failure(step volume.Step, err error) *Failure {
	if err == nil {
		return nil
	}
	return &Failure{Step: step, Err: err, Time: w.now()}
}

// RecordAttach records the result of waiting for attach: with a nil err the
// volume is attached with publishContext (copied; nil when the driver needs
// no attach) and an earlier attach error is cleared; otherwise it is not
// attached and err is its last error.
func (w *World) RecordAttach(name volume.Name, id volume.ID, publishContext map[string]string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := w.volume(name, id)
	if err != nil {
		v.attached, v.publishContext = false, nil
		v.lastErr = w.failure(volume.StepWaitForAttach, err)
		return
	}
	v.attached, v.publishContext = true, maps.Clone(publishContext)
	if v.lastErr != nil && v.lastErr.Step == volume.StepWaitForAttach {
		v.lastErr = nil
	}
}

// RecordStage records the outcome of a stage or unstage step. A nil
// o.Err clears the volume's last error; reaching Staged also clears the
// reconstructed mark, since the state is now proven. o.External says who
// owns the stage from now on; a volume left NotStaged has nothing to own.
func (w *World) RecordStage(name volume.Name, id volume.ID, o StageOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := w.volume(name, id)
	v.stage = o.State
	v.external = o.External && o.State != volume.NotStaged
	if o.StagingPath != "" {
		v.stagingPath = o.StagingPath
	}
	if o.State == volume.Staged {
		v.reconstructed = false
		v.seLinuxContext = o.SELinuxContext
	}
	v.migrated = v.migrated || o.Migrated
	v.lastErr = w.failure(o.Step, o.Err)
}

// RecordPublish records the outcome of a publish or unpublish step for one
// pod. A nil o.Err clears the pod's last error; reaching Published also
// clears the reconstructed mark. o.External says who owns the publish.
func (w *World) RecordPublish(key volume.PodKey, id volume.ID, o PublishOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pod(key, id)
	if o.Migrated {
		w.volumes[key.Volume].migrated = true
	}
	p.state = o.State
	p.external = o.External
	if o.TargetPath != "" {
		p.targetPath = o.TargetPath
	}
	if o.State == volume.Published {
		p.reconstructed = false
	}
	p.lastErr = w.failure(o.Step, o.Err)
	p.progress = nil
	if o.Presentation != nil {
		p.presentation = *o.Presentation
	}
}

// pod returns the entry of key, creating it (and its volume with id).
// mu must be held for writing.
func (w *World) pod(key volume.PodKey, id volume.ID) *podEntry {
	v := w.volume(key.Volume, id)
	p, ok := v.pods[key.Pod]
	if !ok {
		p = &podEntry{}
		v.pods[key.Pod] = p
		byVolume := w.byPod[key.Pod]
		if byVolume == nil {
			byVolume = map[volume.Name]*podEntry{}
			w.byPod[key.Pod] = byVolume
		}
		byVolume[key.Volume] = p
	}
	return p
}

// AddReconstructedVolume records a volume found at start-up (a staged
// record, a staging mount): stage uncertain and marked reconstructed, so
// that a final error does not clear the state and teardown still runs; not
// known to be attached until the next RecordAttach. An entry that already
// exists keeps its states.
func (w *World) AddReconstructedVolume(name volume.Name, id volume.ID, stagingPath string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.volumes[name]; ok {
		return
	}
	v := w.volume(name, id)
	v.stage, v.stagingPath, v.reconstructed = volume.StageUncertain, stagingPath, true
}

// AddReconstructedPod records a pod's publish found at start-up (a pod
// volume directory): publish uncertain and marked reconstructed. The volume
// entry is created as by AddReconstructedVolume if missing, except for an
// inline (ephemeral) volume, which is never staged: its entry is NotStaged,
// so that its teardown sends no NodeUnstageVolume. An existing pod entry
// keeps its state.
func (w *World) AddReconstructedPod(key volume.PodKey, id volume.ID, targetPath string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v, ok := w.volumes[key.Volume]; ok {
		if _, ok := v.pods[key.Pod]; ok {
			return
		}
	} else if !key.Volume.IsInline() {
		v := w.volume(key.Volume, id)
		v.stage, v.reconstructed = volume.StageUncertain, true
	}
	p := w.pod(key, id)
	p.state, p.targetPath, p.reconstructed = volume.PublishUncertain, targetPath, true
}

// ForgetPod removes a pod's entry for a volume: after a successful
// unpublish, or when the pod's failed publish is no longer wanted.
func (w *World) ForgetPod(key volume.PodKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forgetPod(key)
}

func (w *World) forgetPod(key volume.PodKey) {
	if v, ok := w.volumes[key.Volume]; ok {
		delete(v.pods, key.Pod)
	}
	if byVolume, ok := w.byPod[key.Pod]; ok {
		delete(byVolume, key.Volume)
		if len(byVolume) == 0 {
			delete(w.byPod, key.Pod)
		}
	}
}

// ForgetVolume removes a volume and its pod entries: after a successful
// unstage, which ends the volume's life on the node.
func (w *World) ForgetVolume(name volume.Name) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v, ok := w.volumes[name]
	if !ok {
		return
	}
	for uid := range v.pods {
		w.forgetPod(volume.PodKey{Volume: name, Pod: uid})
	}
	delete(w.volumes, name)
}
