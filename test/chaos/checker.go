package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// volState is the journal's view of one volume in its plugin.
type volState struct {
	// staged is the staging path of the last OK NodeStageVolume not undone since; "" when not
	// staged.
	staged string
	// stagedUnknown: a stage or unstage was interrupted (the plugin died in it), so whether the
	// volume is staged is unknown until the next OK stage or unstage.
	stagedUnknown bool
	// published holds the targets of OK (or interrupted) NodePublishVolumes not undone by an OK
	// NodeUnpublishVolume.
	published map[string]bool
}

// callKey identifies a call in a plugin's journal.
type callKey struct {
	pid int
	seq uint64
}

// pluginJournal is the checker's state of one plugin's journal.
type pluginJournal struct {
	inFlight map[callKey]plugin.Entry
	pid      int
}

// Checker follows the plugins' journals and what the workload does, and records the violations
// of the invariants that can be decided from them. It is safe for concurrent use.
type Checker struct {
	// OnViolation, when set before use, is told of each violation as it is found; it must not
	// call the Checker.
	OnViolation func(Violation)

	// slack is how long a new pod may stay unknown to the agent (watch latency) before an
	// unstage of its volume counts against it, provided the API server was up all that time.
	slack time.Duration

	mu      sync.Mutex
	pods    map[types.UID]*Pod
	targets map[string]targetRef
	// mapFiles and subPaths index the pods' block map bind mounts and subPath directories,
	// stagingMounts the volumes' staging mount points (for InvUnmountLive).
	mapFiles, subPaths map[string]targetRef
	stagingMounts      map[string]VolKey
	vols               map[VolKey]*Vol
	state              map[VolKey]*volState
	journals           map[string]*pluginJournal

	// outages are the API server outages: while one lasts, the agent cannot learn of new pods.
	outages []interval

	// unresolved are the calls waiting for their pod to be recorded.
	unresolved []unresolvedCall

	violations []Violation
	// ops counts the node calls the agent made, by method; okOps those that returned OK.
	ops, okOps map[string]int
	// faults counts the injected faults by action ("error Unavailable", "hang", ...).
	faults map[string]int
	// unmounts counts the mount points the mount-table watch saw leave, below the root.
	unmounts int
}

type targetRef struct {
	uid types.UID
	vol VolKey
}

// NewChecker returns a Checker that allows slack between a pod's creation and the agent
// knowing of it.
func NewChecker(slack time.Duration) *Checker {
	return &Checker{
		slack:    slack,
		pods:     map[types.UID]*Pod{},
		targets:  map[string]targetRef{},
		mapFiles: map[string]targetRef{},
		subPaths: map[string]targetRef{},

		stagingMounts: map[string]VolKey{},
		vols:          map[VolKey]*Vol{},
		state:         map[VolKey]*volState{},
		journals:      map[string]*pluginJournal{},
		ops:           map[string]int{},
		okOps:         map[string]int{},
		faults:        map[string]int{},
	}
}

// AddVolume declares a volume.
func (c *Checker) AddVolume(v Vol) {
	c.mu.Lock()
	defer c.mu.Unlock()
	vv := v
	c.vols[v.Key] = &vv
	if v.StagingPath != "" {
		// A filesystem volume is mounted at its staging path, a block volume's device onto
		// <staging path>/device.
		c.stagingMounts[v.StagingPath] = v.Key
		c.stagingMounts[v.StagingPath+"/device"] = v.Key
	}
}

// AddPod declares a pod the API server accepted, with its volumes (which must be declared).
func (c *Checker) AddPod(p Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pp := p
	pp.Volumes = slices.Clone(p.Volumes)
	c.pods[p.UID] = &pp
	for _, v := range p.Volumes {
		ref := targetRef{uid: p.UID, vol: v.Vol}
		c.targets[v.Target] = ref
		if v.MapFile != "" {
			c.mapFiles[v.MapFile] = ref
		}
		if v.SubPaths != "" {
			c.subPaths[v.SubPaths] = ref
		}
	}
	c.resolveLocked()
}

// DeleteIssued records that the harness starts deleting the pod now; call it before the
// request.
func (c *Checker) DeleteIssued(uid types.UID, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pods[uid]; ok && p.DeleteIssued.IsZero() {
		p.DeleteIssued = t
	}
}

// interval is a span of time; a zero end means it has not ended.
type interval struct{ start, end time.Time }

// APIDown records that an API server outage starts at t.
func (c *Checker) APIDown(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.outages = append(c.outages, interval{start: t})
}

// APIUp records that the API server outage ends at t.
func (c *Checker) APIUp(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.outages); n > 0 && c.outages[n-1].end.IsZero() {
		c.outages[n-1].end = t
	}
}

// apiUpLocked says whether the API server was up during all of [from, to].
func (c *Checker) apiUpLocked(from, to time.Time) bool {
	for _, o := range c.outages {
		if o.start.Before(to) && (o.end.IsZero() || o.end.After(from)) {
			return false
		}
	}
	return true
}

// Violate records a violation found elsewhere (the samplers, the final checks).
func (c *Checker) Violate(inv Invariant, t time.Time, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violateLocked(inv, t, format, args...)
}

func (c *Checker) violateLocked(inv Invariant, t time.Time, format string, args ...any) {
	v := Violation{Invariant: inv, Time: t, Detail: fmt.Sprintf(format, args...)}
	c.violations = append(c.violations, v)
	if c.OnViolation != nil {
		c.OnViolation(v)
	}
}

// Violations returns every violation so far, in the order they were found.
func (c *Checker) Violations() []Violation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.violations)
}

func (c *Checker) stateOf(k VolKey) *volState {
	s, ok := c.state[k]
	if !ok {
		s = &volState{published: map[string]bool{}}
		c.state[k] = s
	}
	return s
}

// Entry follows one entry of the journal of driver's plugin. Entries of one plugin must come in
// journal order.
func (c *Checker) Entry(driver string, e plugin.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	j, ok := c.journals[driver]
	if !ok {
		j = &pluginJournal{inFlight: map[callKey]plugin.Entry{}}
		c.journals[driver] = j
	}
	switch e.Event {
	case plugin.EventStart:
		// A new plugin process: the calls of the dead one never return.
		for k, begin := range j.inFlight {
			if k.pid != e.PID {
				c.interrupted(driver, begin)
				delete(j.inFlight, k)
			}
		}
		j.pid = e.PID
	case plugin.EventFault:
		c.faults[faultName(e)]++
	case plugin.EventBegin:
		if !isNodeStep(e.Method) {
			return
		}
		c.ops[e.Method]++
		j.inFlight[callKey{e.PID, e.Seq}] = e
		c.begin(driver, e)
	case plugin.EventEnd:
		k := callKey{e.PID, e.Seq}
		begin, ok := j.inFlight[k]
		if !ok {
			return
		}
		delete(j.inFlight, k)
		if e.Code == "OK" {
			c.okOps[begin.Method]++
		}
		c.end(driver, begin, e)
	}
}

func faultName(e plugin.Entry) string {
	if e.Code != "" && e.Message == "error" {
		return "error " + e.Code
	}
	if strings.HasPrefix(e.Message, "delay ") {
		return "delay"
	}
	return e.Message
}

// isNodeStep says whether method is one of the four lifecycle steps of the node service.
func isNodeStep(method string) bool {
	switch method {
	case "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume":
		return true
	}
	return false
}

// begin checks a node step as it arrives at the plugin.
func (c *Checker) begin(driver string, e plugin.Entry) {
	k := VolKey{Driver: driver, Handle: e.VolumeID}
	vol, known := c.vols[k]
	st := c.stateOf(k)
	t := e.Time
	switch e.Method {
	case "NodeStageVolume":
		if known && e.StagingPath != vol.StagingPath {
			c.violateLocked(InvPathEscape, t, "NodeStageVolume of %s at %q, the layout's staging path is %q", k, e.StagingPath, vol.StagingPath)
		}
	case "NodeUnstageVolume":
		if known && e.StagingPath != vol.StagingPath {
			c.violateLocked(InvPathEscape, t, "NodeUnstageVolume of %s at %q, the layout's staging path is %q", k, e.StagingPath, vol.StagingPath)
		}
		if pubs := sortedKeys(st.published); len(pubs) > 0 {
			c.violateLocked(InvUnstagePublished, t, "NodeUnstageVolume of %s while published at %v", k, pubs)
		}
		for _, p := range c.pods {
			if !p.live(t) || !slices.ContainsFunc(p.Volumes, func(v PodVolume) bool { return v.Vol == k }) {
				continue
			}
			switch {
			case c.publishedFor(st, p, k):
				c.violateLocked(InvUnstageWanted, t, "NodeUnstageVolume of %s while live pod %s has it published", k, p.Name)
			case p.Created.Add(c.slack).Before(t) && c.apiUpLocked(p.Created, p.Created.Add(c.slack)):
				c.violateLocked(InvUnstageWanted, t, "NodeUnstageVolume of %s while live pod %s, created %s, wants it",
					k, p.Name, stamp(p.Created))
			}
		}
	case "NodePublishVolume":
		if ref, ok := c.targets[e.TargetPath]; !ok {
			// The agent may see a pod before the workload has recorded it.
			c.unresolved = append(c.unresolved, unresolvedCall{driver: driver, entry: e})
		} else {
			c.checkTarget(ref, k, e)
		}
		if known && vol.Stages {
			if e.StagingPath != vol.StagingPath {
				c.violateLocked(InvPathEscape, t, "NodePublishVolume of %s from %q, the layout's staging path is %q", k, e.StagingPath, vol.StagingPath)
			}
			if st.staged != e.StagingPath || st.stagedUnknown {
				c.violateLocked(InvPublishUnstaged, t, "NodePublishVolume of %s at %s while the journal shows it %s", k, e.TargetPath, stageWord(st))
			}
		}
	case "NodeUnpublishVolume":
		if ref, ok := c.targets[e.TargetPath]; !ok {
			c.unresolved = append(c.unresolved, unresolvedCall{driver: driver, entry: e})
		} else {
			c.checkTarget(ref, k, e)
		}
	}
}

// unresolvedCall is a publish or unpublish whose target no recorded pod had when it arrived.
type unresolvedCall struct {
	driver string
	entry  plugin.Entry
}

// checkTarget checks a publish or unpublish against the pod whose target it names.
func (c *Checker) checkTarget(ref targetRef, k VolKey, e plugin.Entry) {
	if ref.vol != k {
		c.violateLocked(InvPathEscape, e.Time, "%s of %s at %q, the target of %s", e.Method, k, e.TargetPath, ref.vol)
	}
	if p := c.pods[ref.uid]; e.Method == "NodeUnpublishVolume" && p != nil && p.live(e.Time) {
		c.violateLocked(InvUnpublishLive, e.Time, "NodeUnpublishVolume of %s at %s while pod %s is live", k, e.TargetPath, p.Name)
	}
}

// resolveLocked checks the unresolved calls whose target a pod recorded since has.
func (c *Checker) resolveLocked() {
	kept := c.unresolved[:0]
	for _, u := range c.unresolved {
		ref, ok := c.targets[u.entry.TargetPath]
		if !ok {
			kept = append(kept, u)
			continue
		}
		c.checkTarget(ref, VolKey{Driver: u.driver, Handle: u.entry.VolumeID}, u.entry)
	}
	c.unresolved = kept
}

// Finish reports the calls whose target no pod of the workload ever had. Call it once the
// journals are read to their end.
func (c *Checker) Finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, u := range c.unresolved {
		c.violateLocked(InvPathEscape, u.entry.Time, "%s of %s at %q: no pod of the workload has that target",
			u.entry.Method, VolKey{Driver: u.driver, Handle: u.entry.VolumeID}, u.entry.TargetPath)
	}
	c.unresolved = nil
}

// publishedFor says whether the journal shows the volume published for the pod.
func (c *Checker) publishedFor(st *volState, p *Pod, k VolKey) bool {
	for _, v := range p.Volumes {
		if v.Vol == k && st.published[v.Target] {
			return true
		}
	}
	return false
}

func stageWord(st *volState) string {
	switch {
	case st.stagedUnknown:
		return "uncertainly staged (a stage or unstage was interrupted)"
	case st.staged == "":
		return "not staged"
	}
	return "staged at " + st.staged
}

// end applies the effect of a node step that returned.
func (c *Checker) end(driver string, begin, end plugin.Entry) {
	if end.Code != "OK" {
		return // the plugin fails a step before doing anything
	}
	st := c.stateOf(VolKey{Driver: driver, Handle: begin.VolumeID})
	switch begin.Method {
	case "NodeStageVolume":
		st.staged, st.stagedUnknown = begin.StagingPath, false
	case "NodeUnstageVolume":
		st.staged, st.stagedUnknown = "", false
	case "NodePublishVolume":
		st.published[begin.TargetPath] = true
	case "NodeUnpublishVolume":
		delete(st.published, begin.TargetPath)
	}
}

// interrupted applies what may have happened in a step whose plugin died in it.
func (c *Checker) interrupted(driver string, begin plugin.Entry) {
	if !isNodeStep(begin.Method) {
		return
	}
	st := c.stateOf(VolKey{Driver: driver, Handle: begin.VolumeID})
	switch begin.Method {
	case "NodeStageVolume", "NodeUnstageVolume":
		st.stagedUnknown = true
	case "NodePublishVolume":
		st.published[begin.TargetPath] = true
	}
}

// Staged says whether the journal shows the volume staged, uncertainly staged or published
// anywhere, or a step of it in flight: what must hold it on the node.
func (c *Checker) Staged(k VolKey) (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if j := c.journals[k.Driver]; j != nil {
		for _, e := range j.inFlight {
			if e.VolumeID == k.Handle {
				return true, e.Method + " in flight"
			}
		}
	}
	st, ok := c.state[k]
	if !ok {
		return false, ""
	}
	if st.staged != "" || st.stagedUnknown {
		return true, stageWord(st)
	}
	if len(st.published) > 0 {
		return true, fmt.Sprintf("published at %v", sortedKeys(st.published))
	}
	return false, ""
}

// StillStaged lists the volumes the journal shows staged, uncertainly staged or published.
func (c *Checker) StillStaged() []string {
	c.mu.Lock()
	keys := make([]VolKey, 0, len(c.state))
	for k := range c.state {
		keys = append(keys, k)
	}
	c.mu.Unlock()
	var out []string
	for _, k := range keys {
		if held, why := c.Staged(k); held {
			out = append(out, k.String()+": "+why)
		}
	}
	sort.Strings(out)
	return out
}

// Ops returns the node calls the agent made and those that returned OK, by method.
func (c *Checker) Ops() (all, ok map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cloneCounts(c.ops), cloneCounts(c.okOps)
}

// Faults returns the injected faults the plugins' journals show, by action.
func (c *Checker) Faults() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cloneCounts(c.faults)
}

func cloneCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }
