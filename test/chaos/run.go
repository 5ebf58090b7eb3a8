package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// Run runs the workload and the nemeses until the Duration is over (or the Ops and Kills
// targets are reached), then deletes every pod, waits for the node to converge and checks what
// is left. The error is about the harness itself; what the agent did wrong is in the Report's
// Violations. logDir receives the agent's and the plugins' logs and journals.
func (h *Harness) Run(ctx context.Context, logDir string) (*Report, error) {
	h.started = time.Now()
	h.logDir = logDir
	monCtx, stopMonitors := context.WithCancel(ctx)
	defer stopMonitors()
	var monitors sync.WaitGroup
	smp := newSampler(h)
	monitors.Go(func() { h.runJournalPump(monCtx) })
	monitors.Go(func() { h.superviseAgent(monCtx) })
	monitors.Go(func() { smp.run(monCtx) })
	monitors.Go(func() { h.runAttacher(monCtx) })
	monitors.Go(func() { h.watchMounts(monCtx) })

	stopWork, stopNemeses := make(chan struct{}), make(chan struct{})
	var work, nem sync.WaitGroup
	work.Go(func() { h.runWorkload(ctx, stopWork) })
	nem.Go(func() { h.newNemeses(smp).run(ctx, stopNemeses) })
	h.logf("chaos: workload and nemeses started; bound %v, ops %d, kills %d", h.cfg.Duration, h.cfg.Ops, h.cfg.Kills)

	deadline := time.NewTimer(h.cfg.Duration)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case <-deadline.C:
			h.logf("chaos: time is up")
			break wait
		case <-tick.C:
			all, _ := h.checker.Ops()
			if (h.cfg.Ops > 0 || h.cfg.Kills > 0) && sum(all) >= h.cfg.Ops && h.stats.totalKills() >= h.cfg.Kills {
				h.logf("chaos: %d node operations and %d kills reached", sum(all), h.stats.totalKills())
				break wait
			}
		}
	}
	close(stopNemeses)
	nem.Wait()
	close(stopWork)
	work.Wait()
	workload := time.Since(h.started)
	smp.cancel()
	if ctx.Err() != nil {
		// Interrupted: report what was found so far, without the drain and the final checks.
		stopMonitors()
		monitors.Wait()
		rep := h.report(workload, logDir)
		rep.Interrupted = true
		return rep, errors.Join(ctx.Err(), h.saveLogs(logDir))
	}

	h.logf("chaos: draining: deleting every pod and waiting for the node to converge")
	drainErr := h.drain(ctx)
	if drainErr != nil {
		h.logf("chaos: drain: %v", drainErr)
	}
	stopMonitors()
	monitors.Wait()
	if err := h.pumpJournals(); err != nil {
		h.logf("chaos: reading the journals at the end: %v", err)
	}
	h.checker.Finish()
	h.finalChecks(ctx)
	h.stopAgent()
	rep := h.report(workload, logDir)
	if drainErr != nil {
		rep.DrainError = drainErr.Error()
	}
	return rep, errors.Join(drainErr, h.saveLogs(logDir))
}

// drain deletes every pod and waits until the API server has none, no VolumeAttachment is
// left, and the journals show nothing staged or published.
func (h *Harness) drain(ctx context.Context) error {
	deadline := time.Now().Add(h.cfg.ConvergeTimeout)
	var last string
	for time.Now().Before(deadline) {
		for _, p := range h.pods.snapshot() {
			if p.deleteIssued.IsZero() || time.Since(p.lastDelete) > redeleteAfter {
				h.deletePod(ctx, p.uid)
			}
		}
		h.resolvePending(ctx)
		_ = h.pumpJournals()
		last = h.unsettledAtEnd(ctx)
		if last == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("not converged within %v: %s", h.cfg.ConvergeTimeout, last)
}

// unsettledAtEnd says what is still there at the end; "" when nothing is.
func (h *Harness) unsettledAtEnd(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	pods, err := h.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	if n := len(pods.Items); n > 0 {
		return fmt.Sprintf("%d pods left, first %s", n, pods.Items[0].Name)
	}
	vas, err := h.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	if n := len(vas.Items); n > 0 {
		return fmt.Sprintf("%d VolumeAttachments left", n)
	}
	if held := h.checker.StillStaged(); len(held) > 0 {
		return fmt.Sprintf("%d volumes still held, first %s", len(held), held[0])
	}
	return ""
}

// endState is what the node holds at the end, once every pod was deleted and the node
// converged (or the drain gave up).
type endState struct {
	// stillStaged is what the journals show staged, uncertainly staged or published.
	stillStaged []string
	// pluginVols are the volumes in each plugin's state, by driver name.
	pluginVols map[string][]plugin.Volume
	// loops are the loop devices still backed by each plugin's files, by driver name.
	loops map[string][]string
	// mounted are the mount points left below the root.
	mounted []string
	// podsLeft are the pods the API server still has, and whether their deletion was requested.
	podsLeft map[string]bool
	// leftovers are the files and directories left below the root.
	leftovers []string
	// errs are the reads of the end state that failed.
	errs []string
}

// finalChecks looks for what a run must not leave behind once all pods are gone.
func (h *Harness) finalChecks(ctx context.Context) {
	e := endState{stillStaged: h.checker.StillStaged(), pluginVols: map[string][]plugin.Volume{},
		loops: map[string][]string{}, podsLeft: map[string]bool{}}
	for _, role := range h.roles {
		dp := h.plugins[role]
		vols, err := dp.Volumes()
		if err != nil {
			e.errs = append(e.errs, fmt.Sprintf("reading the state of %s: %v", dp.name, err))
		}
		e.pluginVols[dp.name] = vols
		loops, err := loopDevicesOf(dp.StateDir)
		if err != nil {
			e.errs = append(e.errs, fmt.Sprintf("listing loop devices: %v", err))
		}
		e.loops[dp.name] = loops
	}
	mounted, err := readMountTable(h.agent.RootDir + "/")
	if err != nil {
		e.errs = append(e.errs, fmt.Sprintf("reading the mount table: %v", err))
	}
	e.mounted = sortedKeys(mounted)
	lctx, cancel := context.WithTimeout(ctx, apiTimeout)
	pods, err := h.client.CoreV1().Pods(namespace).List(lctx, metav1.ListOptions{})
	cancel()
	if err != nil {
		e.errs = append(e.errs, fmt.Sprintf("listing the pods left: %v", err))
	} else {
		for _, pod := range pods.Items {
			e.podsLeft[pod.Name] = pod.DeletionTimestamp != nil
		}
	}
	e.leftovers, err = leftovers(h.layout, h.agent.RegistrationDir)
	if err != nil {
		e.errs = append(e.errs, fmt.Sprintf("walking the root: %v", err))
	}
	judgeEnd(h.checker, e, time.Now())
}

// judgeEnd records the violations of InvLostUnstage and InvLeak that the end state shows.
func judgeEnd(c *Checker, e endState, now time.Time) {
	for _, held := range e.stillStaged {
		c.Violate(InvLostUnstage, now, "the journal shows %s after all pods are gone", held)
	}
	for _, msg := range e.errs {
		c.Violate(InvLeak, now, "%s", msg)
	}
	for _, name := range sortedKeys(e.pluginVols) {
		for _, v := range e.pluginVols[name] {
			switch {
			case v.Staged != nil:
				c.Violate(InvLostUnstage, now, "%s^%s is staged at %s in the plugin's state", name, v.ID, v.Staged.Path)
			case len(v.Published) > 0:
				c.Violate(InvLeak, now, "%s^%s is published in the plugin's state at %v", name, v.ID, keys(v.Published))
			case len(v.Attachments) > 0:
				c.Violate(InvLeak, now, "%s^%s is still attached in the plugin's state", name, v.ID)
			case v.Ephemeral:
				c.Violate(InvLeak, now, "inline volume %s^%s was never deleted", name, v.ID)
			}
		}
	}
	for _, name := range sortedKeys(e.loops) {
		for _, l := range e.loops[name] {
			c.Violate(InvLeak, now, "loop device %s of %s is still attached", l, name)
		}
	}
	for _, mp := range e.mounted {
		c.Violate(InvLeak, now, "%s is still mounted", mp)
	}
	for _, name := range sortedKeys(e.podsLeft) {
		c.Violate(InvLeak, now, "pod %s is still there (deletion requested %v): its deletion was never completed", name, e.podsLeft[name])
	}
	for _, l := range e.leftovers {
		c.Violate(InvLeak, now, "%s is left in the root", l)
	}
}

// leftovers lists what the agent left below its root: every file but the registration sockets
// and the running agent's own lock file and API socket, and every directory below <root>/pods
// and below a driver's directory or the block layout's.
func leftovers(layout paths.Layout, registrationDir string) ([]string, error) {
	root := layout.Root()
	skeleton := map[string]bool{
		root: true, layout.PodsDir(): true, filepath.Dir(filepath.Dir(layout.PluginDir())): true,
		filepath.Dir(layout.PluginDir()): true, layout.PluginDir(): true,
		filepath.Join(layout.PluginDir(), "volumeDevices"):            true,
		filepath.Join(layout.PluginDir(), "volumeDevices", "staging"): true,
		filepath.Join(layout.PluginDir(), "volumeDevices", "publish"): true,
		// The agent still runs at the final checks: its lock and its API socket are there.
		filepath.Join(root, volumemanager.LockFileName): true,
		filepath.Join(root, volumemanager.SocketName):   true,
	}
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case p == registrationDir:
			return fs.SkipDir
		case skeleton[p]:
			return nil
		case d.IsDir() && filepath.Dir(p) == layout.PluginDir():
			return nil // a driver's directory; its volumes' directories are below
		}
		out = append(out, strings.TrimPrefix(p, root+"/"))
		if d.IsDir() {
			return fs.SkipDir
		}
		return nil
	})
	return out, err
}

// loopDevicesOf lists the loop devices whose backing file lies below dir.
func loopDevicesOf(dir string) ([]string, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.HasPrefix(strings.TrimSpace(string(data)), dir+"/") {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out, nil
}

// stopAgent stops the agent with SIGTERM, as a node drain does: it must exit cleanly (a race
// report makes the exit status 66). Its log must show no panic, fatal error or data race.
func (h *Harness) stopAgent() {
	h.agentMu.Lock()
	h.stopping = true
	h.agentMu.Unlock()
	if err := h.agent.Stop(); err != nil {
		h.checker.Violate(InvCrash, time.Now(), "stopping the agent at the end: %v", err)
	}
	data, err := os.ReadFile(h.agent.LogFile)
	if err != nil {
		h.checker.Violate(InvCrash, time.Now(), "reading the agent's log: %v", err)
		return
	}
	checkAgentLog(h.checker, data, time.Now())
}

// checkAgentLog records a violation of InvCrash for each sign of a crash in the agent's log: a
// panic, a fatal error (the runtime's, e.g. a concurrent map write) or a data race report.
func checkAgentLog(c *Checker, data []byte, now time.Time) {
	for _, marker := range []string{"panic:", "fatal error:", "WARNING: DATA RACE"} {
		if i := bytes.Index(data, []byte(marker)); i >= 0 {
			end := min(len(data), i+4000)
			c.Violate(InvCrash, now, "the agent's log shows %q:\n%s", marker, data[i:end])
		}
	}
}

// report gathers the figures of the run.
func (h *Harness) report(workload time.Duration, logDir string) *Report {
	all, ok := h.checker.Ops()
	s := h.stats
	s.mu.Lock()
	defer s.mu.Unlock()
	h.pods.mu.Lock()
	pods := h.pods.created
	h.pods.mu.Unlock()
	enospc, gone := 0, 0
	if data, err := os.ReadFile(h.agent.LogFile); err == nil {
		enospc = bytes.Count(data, []byte("no space left on device"))
		gone = bytes.Count(data, []byte("too old resource version"))
	}
	return &Report{
		Seed: h.cfg.Seed, Started: h.started, Workload: workload, Total: time.Since(h.started), Pods: pods,
		Ops: all, OKOps: ok, Kills: cloneCounts(s.kills), Nemeses: cloneCounts(s.nemeses), Converge: s.converge,
		NotConv: cloneCounts(s.notConv), Outages: s.outages, OutageKill: s.outageKil, Downtime: s.downtime,
		PlugKills: cloneCounts(s.plugKills), Hangs: s.hangs, Codes: cloneCounts(s.codes), FaultsSeen: h.checker.Faults(),
		DiskFulls: s.diskFulls, ENOSPC: enospc, Gone: gone, Attaches: s.attaches, Detaches: s.detaches,
		Violations: h.checker.Violations(), LogDir: logDir,
		Unmounts: h.checker.Unmounts(), NemesisErrors: cloneCounts(s.nemErrs), UnparsedLines: s.unparsed, JournalErrors: s.journalErrs, SamplerErrors: s.samplerErrs,
	}
}

// saveLogs copies the agent's log and the plugins' logs and journals to dir.
func (h *Harness) saveLogs(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{"agent.log": h.agent.LogFile}
	for _, role := range h.roles {
		dp := h.plugins[role]
		files["plugin-"+role+".log"] = dp.LogFile
		files["journal-"+role+".jsonl"] = dp.JournalPath
	}
	var errs []error
	for name, src := range files {
		errs = append(errs, copyFile(src, filepath.Join(dir, name)))
	}
	h.logsSaved = true
	return errors.Join(errs...)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
