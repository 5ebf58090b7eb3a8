package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// pumpJournals feeds what the plugins appended to their journals to the checker. A failed read
// and a line that is not an entry are counted as errors of the run (and logged) here, whoever
// calls it.
func (h *Harness) pumpJournals() error {
	h.pumpMu.Lock()
	defer h.pumpMu.Unlock()
	var errs []error
	for _, role := range h.roles {
		dp := h.plugins[role]
		entries, bad, err := dp.tail.Read()
		if err != nil {
			errs = append(errs, err)
		}
		for _, line := range bad {
			h.logf("chaos: unparsed journal line: %s", line)
		}
		if len(bad) > 0 || err != nil {
			h.stats.journalError(len(bad), err != nil)
		}
		for _, e := range entries {
			if e.Event == plugin.EventFault && e.Message == "hang" {
				h.hangs.Add(1)
			}
			h.checker.Entry(dp.name, e)
		}
	}
	return errors.Join(errs...)
}

// every calls fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		fn()
	}
}

func (h *Harness) runJournalPump(ctx context.Context) {
	every(ctx, 100*time.Millisecond, func() {
		if err := h.pumpJournals(); err != nil {
			h.logf("chaos: reading the journals: %v", err)
		}
	})
}

// superviseAgent watches the agent process: an exit the harness did not inflict is a crash; the
// agent is started again.
func (h *Harness) superviseAgent(ctx context.Context) {
	for {
		h.agentMu.Lock()
		pid, exited := h.agent.PID(), h.agent.Exited()
		h.agentMu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-exited:
		}
		h.agentMu.Lock()
		if h.stopping || h.killed[pid] || h.agent.PID() != pid {
			h.agentMu.Unlock()
			// Inflicted (or restarted meanwhile): wait for the next process.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		err := h.agent.ExitErr()
		h.checker.Violate(InvCrash, time.Now(), "agent (pid %d) exited by itself: %v; log:\n%s", pid, err, h.agent.TailLog(8<<10))
		h.logf("chaos: VIOLATION: the agent (pid %d) exited by itself: %v", pid, err)
		if err := h.startAgent(ctx); err != nil {
			h.logf("chaos: restarting the agent after its crash: %v", err)
		}
		h.agentMu.Unlock()
	}
}

// agentReady says whether the agent answers /readyz with 200.
func (h *Harness) agentReady(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	code, _, err := h.agent.Get(ctx, agenttest.ReadyzPath)
	return err == nil && code == http.StatusOK
}

// sample is one look at the node: the agent, the pods' conditions, the mount table, the faults
// in effect.
type sample struct {
	at         time.Time
	agentReady bool
	apiUp      bool
	// ready holds the pods whose VolumesReady is True; present the pods the API server has.
	ready, present map[types.UID]bool
	// mounted holds the mount points below the root (/proc/self/mountinfo), read after the pods.
	mounted map[string]bool
	// faulted holds the drivers with a nemesis fault in effect, and nodeFault for the node.
	faulted map[string]bool
	// recovering: the last API server outage ended less than Config.OutageRecovery ago.
	recovering bool
}

func (h *Harness) takeSample(ctx context.Context) (sample, error) {
	s := sample{at: time.Now(), agentReady: h.agentReady(ctx), apiUp: !h.apiDown.Load(),
		ready: map[types.UID]bool{}, present: map[types.UID]bool{}, faulted: h.faults.snapshot()}
	if back, ok := h.apiBack.Load().(time.Time); ok && s.at.Sub(back) < h.cfg.OutageRecovery {
		s.recovering = true
	}
	if s.apiUp {
		lctx, cancel := context.WithTimeout(ctx, apiTimeout)
		pods, err := h.client.CoreV1().Pods(namespace).List(lctx, metav1.ListOptions{})
		cancel()
		if err != nil {
			s.apiUp = false
		} else {
			for i := range pods.Items {
				pod := &pods.Items[i]
				s.present[pod.UID] = true
				for _, c := range pod.Status.Conditions {
					if c.Type == status.ConditionVolumesReady && c.Status == corev1.ConditionTrue {
						s.ready[pod.UID] = true
					}
				}
			}
		}
	}
	// Faults that ended while the pods were listed still count for this sample.
	for d := range h.faults.snapshot() {
		s.faulted[d] = true
	}
	var err error
	s.mounted, err = readMountTable(h.agent.RootDir + "/")
	return s, err
}

// healthy says whether both the agent and the API server were up at the sample.
func (s sample) healthy() bool { return s.agentReady && s.apiUp }

// healthyFor says whether the sample is healthy time for a pod with volumes of drivers: the
// agent ready, the API server up (and not just back, see Config.OutageRecovery), and no fault
// on the node or on one of the drivers.
func (s sample) healthyFor(drivers []string) bool {
	if !s.healthy() || s.recovering || s.faulted[nodeFault] {
		return false
	}
	for _, d := range drivers {
		if s.faulted[d] {
			return false
		}
	}
	return true
}

// convergence is the wait for the node to settle after a nemesis ended.
type convergence struct {
	nemesis string
	end     time.Time
	// live are the pods live at the end; deleted those being deleted by then, with their targets
	// (a pod deleted with grace period 0 leaves the API server before its teardown); unwanted the
	// volumes of the staging drivers no live pod used at the end.
	live, deleted map[types.UID]bool
	targets       map[types.UID][]string
	names         map[types.UID]string
	unwanted      map[VolKey]bool
	done          chan time.Duration
}

// maxSampleGap caps the time one sample accounts for: a sampler that stalled (a slow LIST, a
// loaded machine) does not count the stall as healthy time.
const maxSampleGap = 2 * time.Second

// sampler checks InvNotReady, InvReadyUnmounted and the pending convergence once per interval.
type sampler struct {
	h *Harness
	// notReady accumulates, per live pod, the healthy time since its creation, or since the last
	// sample that saw it VolumesReady=True, in which it was not; reported holds the pods
	// already reported.
	notReady map[types.UID]time.Duration
	reported map[types.UID]bool
	// readyUnmounted accumulates, per live pod, the healthy time it has been VolumesReady=True
	// with a target not mounted; unmountedReported holds the episodes already reported.
	readyUnmounted    map[types.UID]time.Duration
	unmountedReported map[types.UID]bool
	// seen holds the pods some sample already accounted for.
	seen map[types.UID]bool
	last time.Time

	mu      sync.Mutex
	pending *convergence
	// unsettled is what kept the last convergence from being reached, as
	// last seen.
	unsettled string
}

// lastUnsettled says what kept the last convergence from being reached.
func (s *sampler) lastUnsettled() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unsettled
}

func newSampler(h *Harness) *sampler {
	return &sampler{h: h, notReady: map[types.UID]time.Duration{}, reported: map[types.UID]bool{},
		readyUnmounted: map[types.UID]time.Duration{}, unmountedReported: map[types.UID]bool{}, seen: map[types.UID]bool{}}
}

// await registers a convergence to wait for after nemesis ended now; the returned channel
// receives the time it took, once.
func (s *sampler) await(nemesis string) <-chan time.Duration {
	h := s.h
	c := &convergence{nemesis: nemesis, end: time.Now(), live: map[types.UID]bool{}, deleted: map[types.UID]bool{},
		targets: map[types.UID][]string{}, names: map[types.UID]string{}, unwanted: map[VolKey]bool{}, done: make(chan time.Duration, 1)}
	for _, p := range h.pods.snapshot() {
		if p.deleteIssued.IsZero() {
			c.live[p.uid] = true
		} else {
			c.deleted[p.uid] = true
		}
		c.targets[p.uid], c.names[p.uid] = p.targets, p.name
	}
	for _, v := range h.vols.all {
		if v.stages && !h.vols.wanted(v.key) {
			c.unwanted[v.key] = true
		}
	}
	s.mu.Lock()
	s.pending = c
	s.mu.Unlock()
	return c.done
}

// cancel drops the pending convergence.
func (s *sampler) cancel() {
	s.mu.Lock()
	s.pending = nil
	s.mu.Unlock()
}

func (s *sampler) run(ctx context.Context) {
	every(ctx, 500*time.Millisecond, func() {
		smp, err := s.h.takeSample(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.h.stats.samplerError()
			s.h.logf("chaos: ERROR: sampling: %v", err)
			return
		}
		s.check(smp)
	})
}

func (s *sampler) check(smp sample) {
	h := s.h
	if smp.apiUp {
		h.markGone(smp.present)
	}
	dt := time.Duration(0)
	if !s.last.IsZero() {
		dt = min(smp.at.Sub(s.last), maxSampleGap)
	}
	s.last = smp.at
	pods := h.pods.snapshot()
	byUID := make(map[types.UID]*workloadPod, len(pods))
	for _, p := range pods {
		byUID[p.uid] = p
		s.checkPod(smp, p, dt)
	}

	s.mu.Lock()
	c := s.pending
	s.mu.Unlock()
	if c == nil {
		return
	}
	why := c.unsettled(h, smp, byUID)
	if !smp.healthy() {
		why = fmt.Sprintf("agent ready %v, API server up %v", smp.agentReady, smp.apiUp)
	}
	if why != "" {
		s.mu.Lock()
		s.unsettled = why
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	if s.pending == c {
		s.pending = nil
		c.done <- smp.at.Sub(c.end)
	}
	s.mu.Unlock()
}

// checkPod checks InvNotReady and InvReadyUnmounted for one pod at a sample; dt is the time
// since the last sample.
func (s *sampler) checkPod(smp sample, p *workloadPod, dt time.Duration) {
	h := s.h
	if !p.deleteIssued.IsZero() {
		// Being deleted: no longer required to be ready (a pod deleted before it reached the
		// bound does not count), and its targets go.
		delete(s.notReady, p.uid)
		delete(s.readyUnmounted, p.uid)
		return
	}
	if !s.seen[p.uid] {
		// The time from the creation to the first sample.
		s.seen[p.uid] = true
		dt = min(max(smp.at.Sub(p.created), 0), maxSampleGap)
	}
	if !smp.apiUp {
		return // the condition is not known
	}
	healthy := smp.healthyFor(p.drivers)
	ready := smp.ready[p.uid]
	if ready {
		delete(s.notReady, p.uid)
	} else {
		if healthy {
			s.notReady[p.uid] += dt
		}
		if d := s.notReady[p.uid]; d > h.cfg.ReadyBound && !s.reported[p.uid] {
			s.reported[p.uid] = true
			h.checker.Violate(InvNotReady, smp.at, "pod %s, created %s, has no VolumesReady=True after %v of healthy time (targets %v, mounted %v)",
				p.name, stamp(p.created), d.Round(time.Second), p.targets, mountedOf(smp, p))
		}
	}
	if !ready || allMounted(smp, p) {
		delete(s.readyUnmounted, p.uid)
		delete(s.unmountedReported, p.uid)
		return
	}
	if healthy {
		s.readyUnmounted[p.uid] += dt
	}
	if d := s.readyUnmounted[p.uid]; d > h.cfg.ReadyGrace && !s.unmountedReported[p.uid] {
		s.unmountedReported[p.uid] = true
		h.checker.Violate(InvReadyUnmounted, smp.at, "pod %s is VolumesReady=True while its targets %v are not all mounted (mounted: %v), for %v of healthy time",
			p.name, p.targets, mountedOf(smp, p), d.Round(100*time.Millisecond))
	}
}

// unsettled says what still keeps the node from having converged; "" when it has: every pod
// live at the end of the nemesis and still live is VolumesReady=True with its targets mounted;
// every pod being deleted by then, or deleted since (whether or not the API server still has
// it), has no target mounted; every volume of a staging driver no live pod wanted then, nor
// wants now, is not staged.
func (c *convergence) unsettled(h *Harness, smp sample, byUID map[types.UID]*workloadPod) string {
	for _, uid := range sortedUIDs(c.live) {
		if p, ok := byUID[uid]; ok && p.deleteIssued.IsZero() {
			if !smp.ready[uid] || !allMounted(smp, p) {
				return fmt.Sprintf("pod %s not ready (VolumesReady=True %v, mounted %v of %v)", p.name, smp.ready[uid], mountedOf(smp, p), p.targets)
			}
			continue
		}
		// Deleted since: it must be torn down.
		if t := firstMounted(smp, c.targets[uid]); t != "" {
			return fmt.Sprintf("pod %s (deleted since) still mounted at %s", c.names[uid], t)
		}
	}
	for _, uid := range sortedUIDs(c.deleted) {
		if t := firstMounted(smp, c.targets[uid]); t != "" {
			return fmt.Sprintf("pod %s (deleted) still mounted at %s", c.names[uid], t)
		}
	}
	for _, k := range sortedVolKeys(c.unwanted) {
		if h.vols.wanted(k) {
			continue
		}
		if v := h.vols.byKey[k]; smp.mounted[v.stagingPath] || smp.mounted[v.stagingPath+"/device"] {
			return fmt.Sprintf("%s still staged", k)
		}
	}
	return ""
}

func allMounted(smp sample, p *workloadPod) bool {
	for _, t := range p.targets {
		if !smp.mounted[t] {
			return false
		}
	}
	return true
}

// mountedOf lists the pod's targets the sample shows mounted.
func mountedOf(smp sample, p *workloadPod) []string {
	var out []string
	for _, t := range p.targets {
		if smp.mounted[t] {
			out = append(out, t)
		}
	}
	return out
}

func firstMounted(smp sample, targets []string) string {
	for _, t := range targets {
		if smp.mounted[t] {
			return t
		}
	}
	return ""
}

func sortedUIDs(m map[types.UID]bool) []types.UID {
	out := make([]types.UID, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sortedVolKeys(m map[VolKey]bool) []VolKey {
	out := make([]VolKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b VolKey) int { return strings.Compare(a.String(), b.String()) })
	return out
}
