package runtimepods

import (
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
)

// The reasons Held gives for a pod it holds, as the status API shows them.
const (
	// ReasonLeftAPIServer: the pod left the desired state without a word
	// from the runtime (force delete, pod garbage collection).
	ReasonLeftAPIServer = "the pod is no longer in the API server; waiting for the runtime to say its containers " +
		"stopped (containers-stopped or running-pods)"
	// ReasonFoundOnDisk: a publish found on disk at start, of a pod the API
	// server does not have.
	ReasonFoundOnDisk = "the pod's volumes were found on disk at start and the pod is not in the API server; " +
		"waiting for the runtime to say its containers stopped (containers-stopped or running-pods)"
)

// How a pod was released, for the logs.
const (
	releasedStopped    = "containers-stopped"
	releasedNotRunning = "not-in-running-pods"
	releasedTerminal   = "terminal-phase"
)

// pruneAfter is how long the record of a pod with nothing left on the node
// is kept. It outlasts any step in flight: a publish that started before the
// pod was released and ends after would otherwise find the release gone.
const pruneAfter = 5 * time.Minute

// minPruneAt is the number of records below which records are pruned only
// at the runtime's reports.
const minPruneAt = 64

// States is what Pods reads of the desired and actual states.
type States interface {
	// Wanted says whether the pod is in the desired state.
	Wanted(uid types.UID) bool
	// Published says whether the actual state holds a publish of the pod
	// (present or uncertain) the agent made.
	Published(uid types.UID) bool
	// Unwanted returns the pods not in the desired state of which the
	// actual state holds a publish the agent made (not one a container
	// orchestrator asked for through the front endpoint).
	Unwanted() []types.UID
}

// Config configures Pods.
type Config struct {
	// States are the desired and actual states. Required.
	States States
	// Synced tells whether the desired state has seen every pod (the
	// populator's HasSynced): before, a pod not resolved yet looks like a
	// pod that left. Required.
	Synced func() bool
	// OnRelease, when set, is told of every pod released, so that its
	// teardown starts at once. It must not block, nor call Pods.
	OnRelease func(uid types.UID)
	// Logger logs each hold once and each release of a held pod.
	Logger klog.Logger
	// Clock dates the records for pruning; nil means the real clock.
	Clock clock.PassiveClock
}

// Pods records what the runtime said of its pods and answers which pods'
// volumes must stay (Held). Its methods are safe for concurrent use; none
// blocks.
type Pods struct {
	cfg   Config
	clock clock.PassiveClock

	// mu protects pods, leaves, running, runningAsOf and pruneAt. States
	// is read under it; States never calls Pods.
	mu   sync.Mutex
	pods map[types.UID]*record
	// leaves counts the pods that left the desired state: a report is dated
	// by this count when the runtime starts listing its pods (Mark).
	leaves uint64
	// running is the latest report, nil before the first; runningAsOf its
	// date.
	running     map[types.UID]struct{}
	runningAsOf uint64
	// pruneAt is the number of records above which a new record prunes.
	pruneAt int
}

// record is what Pods knows of one pod.
type record struct {
	// left is the pod's number among the pods that left the desired state;
	// hasLeft is false for a pod never seen leaving it (found on disk at
	// start, or still wanted).
	left    uint64
	hasLeft bool
	// wanted says the pod was in the desired state in this run: a report
	// releases it only once its leaving is recorded (hasLeft), never as a
	// pod found on disk.
	wanted bool
	// released is how the pod was released; empty while it is not.
	released string
	// logged says its hold was logged.
	logged bool
	// changed is when the record last changed.
	changed time.Time
}

// New returns Pods for cfg.
func New(cfg Config) (*Pods, error) {
	if cfg.States == nil || cfg.Synced == nil {
		return nil, errors.New("runtimepods: States and Synced are required")
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Pods{cfg: cfg, clock: clk, pods: map[types.UID]*record{}, pruneAt: minPruneAt}, nil
}

// DesiredStateHandler notes when each pod leaves the desired state, so that
// only the runtime's reports after that count for it. Subscribe it to the
// desired state before the reconciler's handler, so that the note is taken
// before the pod's teardown is considered.
func (p *Pods) DesiredStateHandler() dsw.Handler { return dsw.Handler{Pod: p.podChanged} }

func (p *Pods) podChanged(uid types.UID) {
	wanted := p.cfg.States.Wanted(uid)
	p.mu.Lock()
	defer p.mu.Unlock()
	r, known := p.pods[uid]
	if wanted {
		r = p.recordLocked(uid)
		r.wanted, r.hasLeft = true, false
		return
	}
	if known && r.hasLeft {
		return
	}
	r = p.recordLocked(uid)
	p.leaves++
	r.hasLeft, r.left, r.changed = true, p.leaves, p.clock.Now()
}

// Mark dates a report: call it right before the runtime lists the pods it
// runs, and give the list to RunningAsOf with the mark. A pod that left
// the desired state after the mark may have started after the list was
// taken, so that report does not release it.
func (p *Pods) Mark() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaves
}

// ContainersStopped records the runtime's word that the pod's containers
// stopped and will not run again: its volumes may go, whether or not the
// API server (still) has the pod.
func (p *Pods) ContainersStopped(uid types.UID) { p.release(uid, releasedStopped) }

// Terminal records that the API server showed the pod in a terminal phase
// (Succeeded or Failed): its containers are done.
func (p *Pods) Terminal(uid types.UID) { p.release(uid, releasedTerminal) }

func (p *Pods) release(uid types.UID, how string) {
	p.mu.Lock()
	r := p.recordLocked(uid)
	first := r.released == ""
	if first {
		r.released, r.changed = how, p.clock.Now()
	}
	logged := r.logged
	p.mu.Unlock()
	if first {
		p.released(uid, how, logged)
	}
}

// Running records the runtime's report of the pods it still runs (their
// UIDs; an empty list says it runs none): every pod that is held, left
// the desired state before this report (or was found on disk at start)
// and is not in it is released. The kubelet's "ask the runtime" step.
func (p *Pods) Running(uids []types.UID) { p.RunningAsOf(p.Mark(), uids) }

// RunningAsOf is Running for a list the runtime took after Mark returned
// mark. A report older than the latest one is dropped.
func (p *Pods) RunningAsOf(mark uint64, uids []types.UID) {
	var candidates []types.UID
	if p.cfg.Synced() {
		candidates = p.cfg.States.Unwanted()
	}
	running := make(map[types.UID]struct{}, len(uids))
	for _, uid := range uids {
		running[uid] = struct{}{}
	}
	type released struct {
		uid    types.UID
		logged bool
	}
	var out []released
	p.mu.Lock()
	if p.running != nil && mark < p.runningAsOf {
		p.mu.Unlock()
		return
	}
	p.running, p.runningAsOf = running, mark
	for _, uid := range candidates {
		r := p.pods[uid]
		if (r != nil && r.released != "") || !p.notRunningLocked(uid, r) {
			continue
		}
		r = p.recordLocked(uid)
		r.released, r.changed = releasedNotRunning, p.clock.Now()
		out = append(out, released{uid, r.logged})
	}
	p.pruneLocked()
	p.mu.Unlock()
	for _, r := range out {
		p.released(r.uid, releasedNotRunning, r.logged)
	}
}

// Held says whether the volumes of a pod that is not in the desired state
// must stay, and why: the runtime has not released the pod. A pod in the
// desired state is never held. The first time a pod is held it is logged.
// A report that came before the desired state synced counts here.
func (p *Pods) Held(uid types.UID) (reason string, held bool) {
	if !p.cfg.Synced() {
		return "the desired state has not seen every pod yet", true
	}
	if p.cfg.States.Wanted(uid) {
		return "", false
	}
	p.mu.Lock()
	r := p.pods[uid]
	if r != nil && r.released != "" {
		p.mu.Unlock()
		return "", false
	}
	if p.notRunningLocked(uid, r) {
		r = p.recordLocked(uid)
		r.released, r.changed = releasedNotRunning, p.clock.Now()
		logged := r.logged
		p.mu.Unlock()
		p.released(uid, releasedNotRunning, logged)
		return "", false
	}
	r = p.recordLocked(uid)
	reason = heldReason(r)
	first := !r.logged
	r.logged = true
	p.mu.Unlock()
	if first {
		p.cfg.Logger.Info("Keeping the pod's volumes until its runtime says its containers stopped", "podUID", uid, "reason", reason)
	}
	return reason, true
}

// Waiting is Held without its side effects, for the status API: whether
// the pod is held now, and why.
func (p *Pods) Waiting(uid types.UID) (reason string, waiting bool) {
	if !p.cfg.Synced() || p.cfg.States.Wanted(uid) || !p.cfg.States.Published(uid) {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitingLocked(uid)
}

// WaitingPods returns the pods held now (Waiting), unsorted.
func (p *Pods) WaitingPods() []types.UID {
	if !p.cfg.Synced() {
		return nil
	}
	candidates := p.cfg.States.Unwanted()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := candidates[:0]
	for _, uid := range candidates {
		if _, waiting := p.waitingLocked(uid); waiting {
			out = append(out, uid)
		}
	}
	return out
}

// Awaiting counts the pods held now, for the
// csi_volmgr_pods_awaiting_runtime gauge.
func (p *Pods) Awaiting() int { return len(p.WaitingPods()) }

func (p *Pods) waitingLocked(uid types.UID) (string, bool) {
	r := p.pods[uid]
	if (r != nil && r.released != "") || p.notRunningLocked(uid, r) {
		return "", false
	}
	if r == nil {
		return ReasonFoundOnDisk, true
	}
	return heldReason(r), true
}

// notRunningLocked says whether the latest report releases the pod: it was
// dated (Mark) after the pod left the desired state — any report, for a
// pod found on disk and never in the desired state in this run — and does
// not have the pod.
func (p *Pods) notRunningLocked(uid types.UID, r *record) bool {
	if p.running == nil {
		return false
	}
	if _, running := p.running[uid]; running {
		return false
	}
	switch {
	case r == nil:
		// Found on disk at start, never in the desired state.
		return true
	case r.hasLeft:
		return r.left <= p.runningAsOf
	default:
		// Still wanted, or its leaving not recorded yet (the desired
		// state's handlers run after the change): not for this report.
		return !r.wanted
	}
}

func heldReason(r *record) string {
	if r.hasLeft || r.wanted {
		return ReasonLeftAPIServer
	}
	return ReasonFoundOnDisk
}

// released logs a release and starts the pod's teardown.
func (p *Pods) released(uid types.UID, how string, wasHeld bool) {
	if wasHeld {
		p.cfg.Logger.Info("Runtime released the pod's volumes", "podUID", uid, "how", how)
	} else {
		p.cfg.Logger.V(4).Info("Runtime released the pod's volumes", "podUID", uid, "how", how)
	}
	if p.cfg.OnRelease != nil {
		p.cfg.OnRelease(uid)
	}
}

// recordLocked returns the pod's record, made if need be; a new record
// past pruneAt prunes first.
func (p *Pods) recordLocked(uid types.UID) *record {
	if r, ok := p.pods[uid]; ok {
		return r
	}
	if len(p.pods) >= p.pruneAt {
		p.pruneLocked()
	}
	r := &record{changed: p.clock.Now()}
	p.pods[uid] = r
	return r
}

// pruneLocked drops the records of pods with nothing left on the node —
// neither in the desired state nor published — that have not changed for
// pruneAfter, so that the records do not grow with the pods that come and
// go.
func (p *Pods) pruneLocked() {
	now := p.clock.Now()
	for uid, r := range p.pods {
		if now.Sub(r.changed) < pruneAfter || p.cfg.States.Wanted(uid) || p.cfg.States.Published(uid) {
			continue
		}
		delete(p.pods, uid)
	}
	p.pruneAt = max(minPruneAt, 2*len(p.pods))
}

// Len returns the number of records, for tests of the pruning.
func (p *Pods) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pods)
}
