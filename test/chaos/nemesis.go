package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// Nemesis names.
const (
	NemesisKillInStep    = "kill-in-step"
	NemesisKillAnytime   = "kill-anytime"
	NemesisKillTwice     = "kill-twice"
	NemesisAPIOutage     = "api-outage"
	NemesisOutageAndKill = "api-outage-and-kill"
	NemesisPluginKill    = "plugin-kill"
	NemesisPluginHang    = "plugin-hang"
	NemesisErrorCode     = "error-code"
	NemesisDiskFull      = "disk-full"
)

// nemesisWeights says how often each nemesis is picked.
var nemesisWeights = map[string]int{
	NemesisKillInStep:    30,
	NemesisKillAnytime:   20,
	NemesisKillTwice:     8,
	NemesisAPIOutage:     7,
	NemesisOutageAndKill: 4,
	NemesisPluginKill:    10,
	NemesisPluginHang:    7,
	NemesisErrorCode:     16,
	NemesisDiskFull:      8,
}

// NemesisNames lists the nemeses, sorted.
func NemesisNames() []string {
	var out []string
	for n := range nemesisWeights {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// nodeSteps are the lifecycle steps a nemesis may hold or fail.
var nodeSteps = []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeUnstageVolume"}

// errorCodes are the codes the error-code nemesis makes the plugins return, each in turn.
var errorCodes = func() []codes.Code {
	var out []codes.Code
	for c := codes.Canceled; c <= codes.Unauthenticated; c++ {
		out = append(out, c)
	}
	return out
}()

// nemeses picks and runs nemeses one after the other, each followed by the wait for the node to
// converge.
type nemeses struct {
	h       *Harness
	rng     *rand.Rand
	sampler *sampler
	names   []string
	total   int
	codeSeq []codes.Code
}

func (h *Harness) newNemeses(s *sampler) *nemeses {
	n := &nemeses{h: h, rng: rand.New(rand.NewPCG(h.cfg.Seed, 3)), sampler: s}
	n.names = h.cfg.Nemeses
	if len(n.names) == 0 {
		n.names = NemesisNames()
	}
	for _, name := range n.names {
		n.total += nemesisWeights[name]
	}
	n.codeSeq = slices.Clone(errorCodes)
	n.rng.Shuffle(len(n.codeSeq), func(i, j int) { n.codeSeq[i], n.codeSeq[j] = n.codeSeq[j], n.codeSeq[i] })
	return n
}

func (n *nemeses) pick() string {
	r := n.rng.IntN(n.total)
	for _, name := range n.names {
		if r < nemesisWeights[name] {
			return name
		}
		r -= nemesisWeights[name]
	}
	return n.names[len(n.names)-1]
}

// run runs nemeses until ctx ends or stop is closed.
func (n *nemeses) run(ctx context.Context, stop <-chan struct{}) {
	h := n.h
	for i := 0; ; i++ {
		pause := time.Duration(500+n.rng.IntN(2000)) * time.Millisecond
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-time.After(pause):
		}
		name := n.pick()
		began := time.Now()
		what, err := n.act(ctx, name)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			h.stats.nemesisError(name)
			h.logf("chaos: ERROR: nemesis %d %s: %v", i, name, err)
		}
		h.stats.nemesis(name)
		done := n.sampler.await(name)
		select {
		case <-ctx.Done():
			return
		case <-stop:
			n.sampler.cancel()
			return
		case d := <-done:
			h.stats.converged(name, d)
			h.logf("chaos: nemesis %d %s (%s, %v) converged in %v", i, name, what, time.Since(began).Round(100*time.Millisecond), d.Round(100*time.Millisecond))
			if d > 10*time.Second {
				h.logf("chaos: nemesis %d: what kept it from converging last: %s", i, n.sampler.lastUnsettled())
			}
		case <-time.After(h.cfg.ConvergeTimeout):
			n.sampler.cancel()
			h.stats.notConverged(name)
			h.logf("chaos: nemesis %d %s (%s): NOT converged within %v", i, name, what, h.cfg.ConvergeTimeout)
		}
		h.logf("chaos: %s", h.stats.progress(h))
	}
}

// act runs one nemesis until it is over: the agent runs again, the API server serves, the
// plugin serves without faults, the disk has room. It returns what it did.
func (n *nemeses) act(ctx context.Context, name string) (string, error) {
	h := n.h
	switch name {
	case NemesisKillInStep:
		return n.killInStep(ctx)
	case NemesisKillAnytime:
		time.Sleep(time.Duration(n.rng.IntN(3000)) * time.Millisecond)
		if err := h.killAgent("anytime"); err != nil {
			return "", err
		}
		return "killed at a random moment", n.restartAgent(ctx)
	case NemesisKillTwice:
		if err := h.killAgent("anytime"); err != nil {
			return "", err
		}
		if err := n.restartAgent(ctx); err != nil {
			return "", err
		}
		again := time.Duration(n.rng.IntN(1500)) * time.Millisecond
		time.Sleep(again)
		if err := h.killAgent("right after a restart"); err != nil {
			return "", err
		}
		return fmt.Sprintf("killed, restarted, killed again after %v", again), n.restartAgent(ctx)
	case NemesisAPIOutage:
		d := time.Duration(5+n.rng.IntN(26)) * time.Second
		h.churn(ctx, n.rng)
		err := h.apiOutage(ctx, d, nil)
		// A pod made once the API server is back must get its volumes too:
		// the agent's watches work again.
		h.createPod(ctx, n.rng)
		return fmt.Sprintf("down %v", d), err
	case NemesisOutageAndKill:
		d := time.Duration(5+n.rng.IntN(26)) * time.Second
		h.churn(ctx, n.rng)
		defer h.createPod(ctx, n.rng) // as for api-outage
		killAfter := time.Duration(n.rng.Int64N(int64(d)))
		return fmt.Sprintf("down %v, agent killed after %v", d, killAfter.Round(time.Second)), h.apiOutage(ctx, d, func() error {
			time.Sleep(killAfter)
			if err := h.killAgent("during an API outage"); err != nil {
				return err
			}
			// The agent starts, but registers its Node only once the API server is back.
			go func() {
				if err := n.restartAgent(ctx); err != nil && ctx.Err() == nil {
					h.stats.nemesisError(NemesisOutageAndKill)
					h.logf("chaos: ERROR: restarting the agent during an outage: %v", err)
				}
			}()
			return nil
		})
	case NemesisPluginKill:
		dp := h.plugins[h.roles[n.rng.IntN(len(h.roles))]]
		down := time.Duration(n.rng.IntN(5000)) * time.Millisecond
		return fmt.Sprintf("%s down %v", dp.role, down), h.killPlugin(ctx, dp, down)
	case NemesisPluginHang:
		dp := h.plugins[h.roles[n.rng.IntN(len(h.roles))]]
		d := h.cfg.CSITimeout + time.Duration(n.rng.Int64N(int64(2*h.cfg.CSITimeout)))
		var rules []plugin.FaultRule
		for _, m := range append(slices.Clone(nodeSteps), "NodeGetCapabilities") {
			rules = append(rules, plugin.FaultRule{Method: m, Hang: true})
		}
		h.stats.hang()
		return fmt.Sprintf("%s hangs for %v", dp.role, d), h.faultFor(ctx, dp, d, rules...)
	case NemesisErrorCode:
		dp := h.plugins[h.roles[n.rng.IntN(len(h.roles))]]
		methods := slices.Clone(nodeSteps)
		if !dp.caps.StageUnstage {
			methods = []string{"NodePublishVolume", "NodeUnpublishVolume"}
		}
		methods = append(methods, "*")
		method := methods[n.rng.IntN(len(methods))]
		code := n.codeSeq[0]
		n.codeSeq = append(n.codeSeq[1:], code)
		times := 1 + n.rng.IntN(4)
		h.stats.faultCode(code.String())
		return fmt.Sprintf("%s %s → %s ×%d", dp.role, method, code, times), h.faultFor(ctx, dp, 8*time.Second,
			plugin.FaultRule{Method: method, Code: code, Message: "chaos: injected " + code.String(), Times: times})
	case NemesisDiskFull:
		d := time.Duration(5+n.rng.IntN(16)) * time.Second
		return fmt.Sprintf("full for %v", d), h.diskFull(ctx, d)
	}
	return "", fmt.Errorf("unknown nemesis %q", name)
}

// nodeFault is the key of faultSet for a fault on the whole node (disk-full).
const nodeFault = "*"

// faultSet holds the nemesis faults in effect, by driver name (nodeFault for the whole node):
// while a pod's plugin or the node is faulted, its time is not healthy (InvNotReady,
// InvReadyUnmounted).
type faultSet struct {
	mu     sync.Mutex
	active map[string]int
}

// begin records a fault on driver (or nodeFault); the returned func ends it.
func (f *faultSet) begin(driver string) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active == nil {
		f.active = map[string]int{}
	}
	f.active[driver]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.active[driver]--; f.active[driver] == 0 {
			delete(f.active, driver)
		}
	}
}

// snapshot returns the drivers (and nodeFault) with a fault in effect.
func (f *faultSet) snapshot() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]bool, len(f.active))
	for d := range f.active {
		out[d] = true
	}
	return out
}

// killInStep holds a node step in a plugin (a fault rule makes it hang) and kills the agent
// while the step is in the plugin. When no such step comes within 20 s, the agent is killed
// anyway.
func (n *nemeses) killInStep(ctx context.Context) (string, error) {
	h := n.h
	method := nodeSteps[n.rng.IntN(len(nodeSteps))]
	var held []*driverPlugin
	for _, role := range h.roles {
		dp := h.plugins[role]
		if !dp.caps.StageUnstage && (method == "NodeStageVolume" || method == "NodeUnstageVolume") {
			continue
		}
		defer h.faults.begin(dp.name)()
		if err := dp.setFaults(plugin.FaultRule{Method: method, Hang: true, Times: 1}); err != nil {
			return "", err
		}
		held = append(held, dp)
	}
	before := h.hangs.Load()
	deadline := time.Now().Add(20 * time.Second)
	for h.hangs.Load() == before && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		_ = h.pumpJournals()
	}
	point := "in " + method
	if h.hangs.Load() == before {
		point = "anytime (no " + method + " came)"
	}
	killErr := h.killAgent(point)
	var errs []error
	for _, dp := range held {
		errs = append(errs, dp.setFaults())
	}
	if killErr != nil {
		return "", errors.Join(append(errs, killErr)...)
	}
	return "killed " + point, errors.Join(append(errs, n.restartAgent(ctx))...)
}

// restartAgent waits a moment and starts the agent again.
func (n *nemeses) restartAgent(ctx context.Context) error {
	time.Sleep(time.Duration(n.rng.IntN(2000)) * time.Millisecond)
	h := n.h
	h.agentMu.Lock()
	defer h.agentMu.Unlock()
	if h.agent.Running() {
		return nil
	}
	return h.startAgent(ctx)
}

// killAgent SIGKILLs the agent, recording the kill as inflicted.
func (h *Harness) killAgent(point string) error {
	h.agentMu.Lock()
	defer h.agentMu.Unlock()
	if !h.agent.Running() {
		return errors.New("the agent is not running")
	}
	h.killed[h.agent.PID()] = true
	if err := h.agent.Kill(); err != nil {
		return err
	}
	h.stats.kill(point)
	return nil
}

// churn deletes two live pods and creates two, so that the agent has work in flight when an
// outage begins.
func (h *Harness) churn(ctx context.Context, rng *rand.Rand) {
	deleted := 0
	for _, p := range h.pods.snapshot() {
		if deleted == 2 {
			break
		}
		if p.deleteIssued.IsZero() {
			h.deletePod(ctx, p.uid)
			deleted++
		}
	}
	for range 2 {
		h.createPod(ctx, rng)
	}
}

// apiOutage stops the API server for d; during runs meanwhile, if set.
func (h *Harness) apiOutage(ctx context.Context, d time.Duration, during func() error) error {
	h.apiDown.Store(true)
	h.checker.APIDown(time.Now())
	began := time.Now()
	err := h.env.StopAPIServer()
	if err == nil && during != nil {
		err = during()
	}
	select {
	case <-ctx.Done():
	case <-time.After(d - time.Since(began)):
	}
	// Start again even after an error: the run must go on.
	var startErr error
	for range 3 {
		if startErr = h.env.StartAPIServer(); startErr == nil {
			break
		}
	}
	h.checker.APIUp(time.Now())
	h.apiBack.Store(time.Now())
	h.apiDown.Store(false)
	h.stats.outage(time.Since(began), during != nil)
	return errors.Join(err, startErr)
}

// killPlugin SIGKILLs a plugin and starts it again after down.
func (h *Harness) killPlugin(ctx context.Context, dp *driverPlugin, down time.Duration) error {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	defer h.faults.begin(dp.name)()
	if err := dp.Kill(); err != nil {
		return err
	}
	h.stats.pluginKill(dp.role)
	time.Sleep(down)
	return dp.Start(ctx)
}

// setFaults replaces a plugin's fault rules.
func (dp *driverPlugin) setFaults(rules ...plugin.FaultRule) error {
	return dp.SetFaults(rules...)
}

// faultFor applies fault rules to a plugin for d.
func (h *Harness) faultFor(ctx context.Context, dp *driverPlugin, d time.Duration, rules ...plugin.FaultRule) error {
	defer h.faults.begin(dp.name)()
	if err := dp.setFaults(rules...); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return dp.setFaults()
}

// fillerName is the file that fills the agent's root.
const fillerName = ".chaos-disk-full"

// diskFull fills the agent's root directory (a small tmpfs) for d, then frees it.
func (h *Harness) diskFull(ctx context.Context, d time.Duration) error {
	defer h.faults.begin(nodeFault)()
	path := filepath.Join(h.agent.RootDir, fillerName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	// Fill the last partial page too.
	for _, n := range []int{4096, 512, 1} {
		for err == nil || errors.Is(err, syscall.ENOSPC) {
			if _, err = f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	closeErr := f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		return errors.Join(fmt.Errorf("filling %s did not end with ENOSPC: %w", path, err), closeErr, os.Remove(path))
	}
	h.stats.diskFull()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return os.Remove(path)
}
