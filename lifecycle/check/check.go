package check

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// Defaults of Config.
const (
	// DefaultHoldTimeout is the short deadline past which the uncertain
	// scenario holds a NodeStageVolume.
	DefaultHoldTimeout = 100 * time.Millisecond
	// DefaultKillAfter is how long after its step's CSI call was sent the
	// volume manager's process is killed, if the step has not ended.
	DefaultKillAfter = 100 * time.Millisecond
	// DefaultRestartDelay is how long a killed volume manager stays down.
	DefaultRestartDelay = time.Second
	// DefaultVolumeSize is the size of the volumes the check creates.
	DefaultVolumeSize int64 = 64 << 20
	// DefaultRetryDelay is the kubelet's first retry delay after a failed
	// or uncertain step (its exponential backoff starts at 500ms).
	DefaultRetryDelay = 500 * time.Millisecond
)

// Config is what a check needs. Endpoint is required.
type Config struct {
	// Endpoint is the node plugin's CSI endpoint (unix:///path or /path).
	Endpoint string
	// ControllerEndpoint is the controller plugin's endpoint; empty means
	// Endpoint (a driver that serves both services on one socket). The
	// controller service, when offered, creates, attaches, expands and
	// deletes the check's volumes.
	ControllerEndpoint string
	// DriverCommand, when set, is a shell command that runs the node
	// plugin: the check starts it, kills and restarts it in the
	// driver-restart scenario, and stops it at the end.
	DriverCommand string
	// Params are CreateVolume's parameters.
	Params map[string]string
	// VolumeHandle is the filesystem volume to use when the driver has no
	// controller service to create volumes with.
	VolumeHandle string
	// VolumeContext is the volume context that goes with VolumeHandle (with
	// Ephemeral, the inline volume's volumeAttributes).
	VolumeContext map[string]string
	// Secrets, when set, are the Secret every volume of the check names in
	// its nodeStageSecretRef, nodePublishSecretRef and nodeExpandSecretRef:
	// NodeStageVolume, NodePublishVolume and NodeExpandVolume get them, as
	// from the agent, for drivers that take their credentials from there.
	// They reach the crash scenarios' volume manager process on its stdin,
	// never on a command line, and are in no report.
	Secrets map[string]string
	// Ephemeral checks CSI inline (ephemeral) volumes, as the kubelet
	// publishes them for a driver whose CSIDriver has volumeLifecycleModes
	// Ephemeral and podInfoOnMount: each is one pod's own (volume_id
	// csi-<sha256 of the pod UID and volume name>), never created by the
	// controller service, attached or staged, published with VolumeContext
	// and the pod's information. The scenarios that share a volume between
	// pods, keep its data across publishes, stage or expand it are skipped.
	// For drivers that serve only inline volumes (secrets-store-csi-driver,
	// cert-manager's csi-driver).
	Ephemeral bool
	// ReadOnly, with Ephemeral, publishes the inline volumes read-only (the
	// pod's csi.readOnly: true), as drivers that serve only read-only
	// volumes require (csi.cert-manager.io, secrets-store): the scenarios
	// then check the files the driver put into the volume instead of
	// writing their own, and those that need to write are skipped.
	ReadOnly bool
	// Scenario, when set, selects the scenarios whose name it matches.
	Scenario *regexp.Regexp
	// ScratchDir is where the scratch root is made; empty means the
	// system's temporary directory.
	ScratchDir string
	// Child returns the command that runs one volume-manager step in a
	// process of its own (the binary's hidden check-step command, which
	// calls RunChild); the crash scenarios kill it. Nil skips them.
	Child ChildCommand
	// Timeout bounds each CSI call, as csiclient does for the agent; 0
	// means csiclient.DefaultTimeout (the kubelet's 2 minutes).
	Timeout time.Duration
	// HoldTimeout, KillAfter, RestartDelay, RetryDelay and VolumeSize: 0
	// means their Default.
	HoldTimeout, KillAfter, RestartDelay, RetryDelay time.Duration
	VolumeSize                                       int64
	// Progress, when set, is told when each scenario starts and ends.
	Progress func(name string, r *Result)
}

func (c *Config) defaults() error {
	if c.Endpoint == "" {
		return errors.New("check: the node plugin's endpoint is required")
	}
	if c.ReadOnly && !c.Ephemeral {
		return errors.New("check: read-only publishes are for inline volumes (Ephemeral) only")
	}
	if c.ControllerEndpoint == "" {
		c.ControllerEndpoint = c.Endpoint
	}
	if c.ScratchDir == "" {
		c.ScratchDir = os.TempDir()
	}
	if c.HoldTimeout == 0 {
		c.HoldTimeout = DefaultHoldTimeout
	}
	if c.KillAfter == 0 {
		c.KillAfter = DefaultKillAfter
	}
	if c.RestartDelay == 0 {
		c.RestartDelay = DefaultRestartDelay
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.VolumeSize == 0 {
		c.VolumeSize = DefaultVolumeSize
	}
	return nil
}

// Scenarios returns the names of every scenario, in the order they run.
func Scenarios() []string {
	var out []string
	for _, s := range scenarios() {
		out = append(out, s.name)
	}
	return out
}

// Run runs the selected scenarios against the driver and returns the
// report; the error is for a check that could not run at all (the driver
// unreachable, the scratch root not made). Whatever happens, including a
// cancelled ctx, everything the check made is torn down and the scratch
// root removed before Run returns; what could not be is in
// Report.Cleanup.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	logger := klog.FromContext(ctx)
	e := &env{cfg: cfg}
	defer func() {
		// The cleanup runs whatever happened to ctx.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		e.close(cctx)
	}()
	root, err := os.MkdirTemp(cfg.ScratchDir, "csi-volmgr-check-")
	if err != nil {
		return nil, fmt.Errorf("making the scratch root: %w", err)
	}
	e.root = root
	if cfg.DriverCommand != "" {
		if e.proc, err = startDriver(ctx, cfg.DriverCommand, cfg.Endpoint, filepath.Join(root, "driver.log")); err != nil {
			return nil, err
		}
	}
	if err := e.connect(ctx); err != nil {
		return nil, err
	}
	report := &Report{Driver: e.driver, Version: e.version, Endpoint: cfg.Endpoint,
		NodeCapabilities: capNames(e.nodeCaps.Types()), ControllerCapabilities: e.ctrlCapNames}
	for _, s := range scenarios() {
		if cfg.Scenario != nil && !cfg.Scenario.MatchString(s.name) {
			continue
		}
		if cfg.Progress != nil {
			cfg.Progress(s.name, nil)
		}
		res := e.runScenario(ctx, s)
		logger.V(2).Info("Scenario done", "scenario", s.name, "status", res.Status, "duration", res.Duration)
		report.Results = append(report.Results, res)
		if cfg.Progress != nil {
			cfg.Progress(s.name, &res)
		}
		if ctx.Err() != nil {
			break
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	report.Cleanup = append(report.Cleanup, e.close(cctx)...)
	report.Duration = time.Since(start)
	if ctx.Err() != nil {
		return report, fmt.Errorf("check interrupted: %w", ctx.Err())
	}
	return report, nil
}

func capNames[T fmt.Stringer](types []T) []string {
	out := make([]string, 0, len(types))
	for _, t := range types {
		out = append(out, t.String())
	}
	return out
}

// env is one run: the driver's connections and what the driver offers.
type env struct {
	cfg  Config
	root string
	proc *driverProc

	client, ctrl *csiclient.Client
	rec          *recorder
	driver       string
	version      string
	nodeID       string
	// topology is NodeGetInfo's accessible topology; constrained says the plugin has
	// VOLUME_ACCESSIBILITY_CONSTRAINTS: CreateVolume then requires the node's topology.
	topology      *csi.Topology
	constrained   bool
	nodeCaps      csiclient.NodeCapabilities
	hasController bool
	ctrlCaps      csiclient.ControllerCapabilities
	ctrlCapNames  []string
	closed        bool
}

func (e *env) connect(ctx context.Context) error {
	timeout := e.cfg.Timeout
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var err error
	e.client, err = csiclient.New(cctx, csiclient.Config{Endpoint: e.cfg.Endpoint, Timeout: timeout})
	if err != nil {
		return err
	}
	info, err := e.client.GetPluginInfo(cctx)
	if err != nil {
		return fmt.Errorf("GetPluginInfo: %w", err)
	}
	e.driver, e.version = info.GetName(), info.GetVendorVersion()
	// A connection named after the driver, for its errors and logs.
	_ = e.client.Close()
	if e.client, err = csiclient.New(cctx, csiclient.Config{DriverName: e.driver, Endpoint: e.cfg.Endpoint, Timeout: timeout}); err != nil {
		return err
	}
	e.rec = newRecorder(e.client, e.cfg.HoldTimeout)
	if e.nodeCaps, err = e.client.NodeCapabilities(cctx); err != nil {
		return fmt.Errorf("NodeGetCapabilities: %w", err)
	}
	ni, err := e.client.NodeGetInfo(cctx)
	if err != nil {
		return fmt.Errorf("NodeGetInfo: %w", err)
	}
	e.nodeID = ni.GetNodeId()
	e.topology = ni.GetAccessibleTopology()
	e.ctrl = e.client
	if e.cfg.ControllerEndpoint != e.cfg.Endpoint {
		if e.ctrl, err = csiclient.New(cctx, csiclient.Config{DriverName: e.driver, Endpoint: e.cfg.ControllerEndpoint, Timeout: timeout}); err != nil {
			return err
		}
	}
	// A CO calls the controller service only of a plugin that advertises
	// it (as the external-provisioner checks): a node-only plugin's
	// volumes are --volume-handle's.
	plugCaps, err := e.ctrl.GetPluginCapabilities(cctx)
	if err != nil {
		return fmt.Errorf("GetPluginCapabilities: %w", err)
	}
	if !hasControllerService(plugCaps) {
		return nil
	}
	e.constrained = hasAccessibilityConstraints(plugCaps)
	resp, err := e.ctrl.Controller().ControllerGetCapabilities(cctx, &csi.ControllerGetCapabilitiesRequest{})
	if err == nil {
		e.hasController = true
		var types []csi.ControllerServiceCapability_RPC_Type
		for _, c := range resp.GetCapabilities() {
			types = append(types, c.GetRpc().GetType())
		}
		e.ctrlCaps = csiclient.NewControllerCapabilities(types...)
		e.ctrlCapNames = capNames(types)
	}
	return nil
}

// hasControllerService says whether the plugin advertises the controller
// service.
func hasControllerService(resp *csi.GetPluginCapabilitiesResponse) bool {
	for _, c := range resp.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
			return true
		}
	}
	return false
}

func hasAccessibilityConstraints(resp *csi.GetPluginCapabilitiesResponse) bool {
	for _, c := range resp.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS {
			return true
		}
	}
	return false
}

// accessibility is CreateVolume's accessibility requirements: the node's topology, requisite and
// preferred, as the external-provisioner asks for the node a pod was scheduled to (a
// WaitForFirstConsumer claim), when the plugin has VOLUME_ACCESSIBILITY_CONSTRAINTS. A
// node-local driver (TopoLVM) must create the check's volumes on the node under check.
func (e *env) accessibility() *csi.TopologyRequirement {
	if !e.constrained || len(e.topology.GetSegments()) == 0 {
		return nil
	}
	return &csi.TopologyRequirement{Requisite: []*csi.Topology{e.topology}, Preferred: []*csi.Topology{e.topology}}
}

// canCreate says whether the check creates its volumes itself.
func (e *env) canCreate() bool {
	return e.hasController && e.ctrlCaps.Has(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME)
}

// close stops what the run started and removes the scratch root; it
// returns what it could not clean up. It runs once.
func (e *env) close(ctx context.Context) []string {
	if e.closed {
		return nil
	}
	e.closed = true
	var problems []string
	if e.rec != nil {
		e.rec.background.Wait()
	}
	if e.root != "" {
		problems = append(problems, sweep(ctx, e.root)...)
		if err := removeRoot(e.root); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if e.ctrl != nil && e.ctrl != e.client {
		_ = e.ctrl.Close()
	}
	if e.client != nil {
		_ = e.client.Close()
	}
	if e.proc != nil {
		if err := e.proc.stop(); err != nil {
			problems = append(problems, "stopping the driver: "+err.Error())
		}
	}
	return problems
}

// runScenario runs one scenario with its own root below the scratch root,
// and cleans up after it.
func (e *env) runScenario(ctx context.Context, s scenario) (res Result) {
	res = Result{Name: s.name, Title: s.title}
	start := time.Now()
	defer func() { res.Duration = time.Since(start) }()
	if reason := s.needs(e); reason != "" {
		res.Status, res.Reason = Skipped, reason
		return res
	}
	r := &run{env: e, name: s.name, root: filepath.Join(e.root, s.name)}
	if err := os.MkdirAll(r.root, 0o750); err != nil {
		res.Status, res.Reason, res.Got = Fail, "making the scenario's root", err.Error()
		return res
	}
	e.rec.take()
	err := s.run(ctx, r)
	// A call whose answer was withheld may still be running: the teardown
	// waits for it, lest it stage what was just unstaged.
	e.rec.background.Wait()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	// A driver that died is restarted, as its container would be, so that
	// the cleanup and the next scenarios run against it.
	crash := e.restartCrashedDriver(cctx)
	res.Cleanup = r.cleanup(cctx)
	if again := e.restartCrashedDriver(cctx); crash == nil {
		crash = again
	}
	res.Calls = e.rec.take()
	var f *failure
	var sk *skip
	switch {
	case crash != nil:
		res.Status, res.Reason, res.Got = Fail, "the driver died", crash.Error()
		res.Expected = "the node plugin running through the scenario and its teardown, as the kubelet expects of the driver's container"
	case err == nil && len(res.Cleanup) > 0:
		res.Status, res.Reason = Fail, "cleanup after the scenario"
		res.Expected = "nothing left after the teardown: every call answered OK and every path it was asked to unmount unmounted"
		res.Got = strings.Join(res.Cleanup, "; ")
	case err == nil:
		res.Status = Pass
	case errors.As(err, &f):
		res.Status, res.Reason, res.Expected, res.Got = Fail, f.step, f.expected, f.got
	case errors.As(err, &sk) && len(res.Cleanup) == 0:
		res.Status, res.Reason = Skipped, sk.reason
	case ctx.Err() != nil:
		res.Status, res.Reason, res.Got = Fail, "interrupted", err.Error()
	default:
		res.Status, res.Reason, res.Got = Fail, "the check itself", err.Error()
	}
	return res
}

// restartCrashedDriver restarts the driver of --driver-command when it
// died without the check ending it (driverProc.crashed), and waits until
// it answers on the check's connection. It returns nil when the driver did not crash, else
// how it exited and, if it does not serve again, why.
func (e *env) restartCrashedDriver(ctx context.Context) error {
	if e.proc == nil {
		return nil
	}
	crash := e.proc.crashed()
	if crash == nil {
		return nil
	}
	klog.FromContext(ctx).Error(crash, "The driver died during the scenario; restarting it")
	start := time.Now()
	// What is left of its command (a wrapper, daemons) goes first, as a
	// container runtime ends the whole container before starting it again.
	if err := e.proc.kill(); err != nil {
		return fmt.Errorf("%w; ending what was left of it: %w", crash, err)
	}
	if err := e.proc.start(ctx); err != nil {
		return fmt.Errorf("%w; restarting it: %w", crash, err)
	}
	e.rec.add(Call{Method: "(driver restart)", Code: "-", Duration: time.Since(start), Note: "it had died: SIGKILL to what was left, then --driver-command again"})
	if err := (&run{env: e}).reconnected(ctx); err != nil {
		return fmt.Errorf("%w; restarted, then: %w", crash, err)
	}
	return crash
}

// skip ends a scenario that finds, once it runs, that the driver does not
// offer what it checks: a filesystem-only driver that refuses a block volume.
type skip struct{ reason string }

func (s *skip) Error() string { return "skipped: " + s.reason }

// failure is a scenario's failure: at which step, what the CSI spec or the
// kubelet expects, what the driver did.
type failure struct {
	step, expected, got string
}

func (f *failure) Error() string {
	return fmt.Sprintf("%s: expected %s, got %s", f.step, f.expected, f.got)
}

// fail returns a failure.
func fail(step, expected string, got any) error {
	g := fmt.Sprint(got)
	if err, ok := got.(error); ok {
		g = describe(err)
	}
	return &failure{step: step, expected: expected, got: g}
}

// describe is an error as a driver author reads it: the gRPC code and the
// driver's message when there is one.
func describe(err error) string {
	if err == nil {
		return "success"
	}
	var rpc *csiclient.RPCError
	if errors.As(err, &rpc) {
		return fmt.Sprintf("%s failed: %s", rpc.Method, strings.TrimSpace(rpc.Err.Error()))
	}
	return err.Error()
}
