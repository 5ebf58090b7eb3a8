package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// pumpJournals feeds what the plugins appended to their journals to the checker.
func (h *Harness) pumpJournals() error {
	h.pumpMu.Lock()
	defer h.pumpMu.Unlock()
	var errs []error
	for _, role := range h.roles {
		dp := h.plugins[role]
		entries, err := dp.tail.Read()
		if err != nil {
			errs = append(errs, err)
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

// sample is one look at the node: the agent, the pods' conditions, the mount table.
type sample struct {
	at         time.Time
	agentReady bool
	apiUp      bool
	// ready holds the pods whose VolumesReady is True; present the pods the API server has.
	ready, present map[types.UID]bool
	mounted        map[string]bool
}

func (h *Harness) takeSample(ctx context.Context) (sample, error) {
	s := sample{at: time.Now(), agentReady: h.agentReady(ctx), apiUp: !h.apiDown.Load(),
		ready: map[types.UID]bool{}, present: map[types.UID]bool{}}
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
	mps, err := mount.New("").List()
	if err != nil {
		return s, err
	}
	s.mounted = make(map[string]bool, len(mps))
	root := h.agent.RootDir + "/"
	for _, mp := range mps {
		if strings.HasPrefix(mp.Path, root) {
			s.mounted[mp.Path] = true
		}
	}
	return s, nil
}

// healthy says whether both the agent and the API server were up at the sample.
func (s sample) healthy() bool { return s.agentReady && s.apiUp }

// convergence is the wait for the node to settle after a nemesis ended.
type convergence struct {
	nemesis string
	end     time.Time
	// live are the pods live at the end; deleted those being deleted by then; unwanted the
	// volumes of the staging drivers no live pod used at the end.
	live, deleted map[types.UID]bool
	unwanted      map[VolKey]bool
	done          chan time.Duration
}

// sampler checks InvNotReady and the pending convergence once per interval.
type sampler struct {
	h *Harness
	// notReady accumulates, per pod, the healthy time its volumes were all mounted without
	// VolumesReady=True; reported holds the pods already reported.
	notReady map[types.UID]time.Duration
	reported map[types.UID]bool
	last     time.Time

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
	return &sampler{h: h, notReady: map[types.UID]time.Duration{}, reported: map[types.UID]bool{}}
}

// await registers a convergence to wait for after nemesis ended now; the returned channel
// receives the time it took, once.
func (s *sampler) await(nemesis string) <-chan time.Duration {
	h := s.h
	c := &convergence{nemesis: nemesis, end: time.Now(), live: map[types.UID]bool{}, deleted: map[types.UID]bool{},
		unwanted: map[VolKey]bool{}, done: make(chan time.Duration, 1)}
	for _, p := range h.pods.snapshot() {
		if p.deleteIssued.IsZero() {
			c.live[p.uid] = true
		} else {
			c.deleted[p.uid] = true
		}
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
			s.h.logf("chaos: sampling: %v", err)
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
		dt = smp.at.Sub(s.last)
	}
	s.last = smp.at
	pods := h.pods.snapshot()
	byUID := make(map[types.UID]*workloadPod, len(pods))
	for _, p := range pods {
		byUID[p.uid] = p
		if !p.deleteIssued.IsZero() || s.reported[p.uid] || !smp.apiUp {
			continue
		}
		if smp.ready[p.uid] || !allMounted(smp, p) {
			delete(s.notReady, p.uid)
			continue
		}
		if smp.healthy() {
			s.notReady[p.uid] += dt
		}
		if s.notReady[p.uid] > h.cfg.ReadyBound {
			s.reported[p.uid] = true
			h.checker.Violate(InvNotReady, smp.at, "pod %s has its volumes mounted at %v and no VolumesReady=True for %v of healthy time",
				p.name, p.targets, s.notReady[p.uid].Round(time.Second))
		}
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

// unsettled says what still keeps the node from having converged; "" when it has.
func (c *convergence) unsettled(h *Harness, smp sample, byUID map[types.UID]*workloadPod) string {
	for uid := range c.live {
		p, ok := byUID[uid]
		if !ok || !p.deleteIssued.IsZero() {
			continue // deleted since: no longer required
		}
		if !smp.ready[uid] || !allMounted(smp, p) {
			return fmt.Sprintf("pod %s not ready", p.name)
		}
	}
	for uid := range c.deleted {
		p, ok := byUID[uid]
		if !ok {
			continue
		}
		for _, t := range p.targets {
			if smp.mounted[t] {
				return fmt.Sprintf("pod %s (deleted) still mounted at %s", p.name, t)
			}
		}
	}
	for k := range c.unwanted {
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
