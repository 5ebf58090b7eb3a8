package plugin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// FaultExit says when a fault rule kills the plugin with SIGKILL.
type FaultExit string

const (
	// ExitBefore kills the plugin before the call does anything.
	ExitBefore FaultExit = "before"
	// ExitAfter kills the plugin after the call did its work, before the reply is sent.
	ExitAfter FaultExit = "after"
)

// faultCountsFile, in the state directory, keeps how often rules with Times fired, across restarts.
const faultCountsFile = "fault-counts.json"

// ErrInvalidFault is wrapped by the errors of FaultConfig.Validate.
var ErrInvalidFault = errors.New("invalid fault rule")

// FaultRule is one fault-injection rule. The JSON form is documented in the package documentation.
type FaultRule struct {
	// Method is the short gRPC method name, e.g. "NodeStageVolume"; "*" matches every method.
	Method string
	// VolumeID, when set, restricts the rule to requests for that volume.
	VolumeID string
	// Code, when not OK, is returned instead of doing the call's work.
	Code codes.Code
	// Message is the error message that goes with Code.
	Message string
	// Delay is waited before anything else; a cancelled call stops waiting.
	Delay time.Duration
	// Hang blocks the call until its context is cancelled.
	Hang bool
	// Exit kills the plugin before or after the call's work.
	Exit FaultExit
	// Times, when positive, limits how often the rule fires, counted across plugin restarts.
	Times int
}

type faultRuleJSON struct {
	Method   string    `json:"method"`
	VolumeID string    `json:"volumeID,omitempty"`
	Code     string    `json:"code,omitempty"`
	Message  string    `json:"message,omitempty"`
	Delay    string    `json:"delay,omitempty"`
	Hang     bool      `json:"hang,omitempty"`
	Exit     FaultExit `json:"exit,omitempty"`
	Times    int       `json:"times,omitempty"`
}

// MarshalJSON writes the documented JSON form: codes by name, delays as Go durations.
func (r FaultRule) MarshalJSON() ([]byte, error) {
	j := faultRuleJSON{Method: r.Method, VolumeID: r.VolumeID, Message: r.Message, Hang: r.Hang, Exit: r.Exit, Times: r.Times}
	if r.Code != codes.OK {
		j.Code = r.Code.String()
	}
	if r.Delay != 0 {
		j.Delay = r.Delay.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads the documented JSON form. Codes may be written "NotFound" or "NOT_FOUND".
func (r *FaultRule) UnmarshalJSON(data []byte) error {
	var j faultRuleJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*r = FaultRule{Method: j.Method, VolumeID: j.VolumeID, Message: j.Message, Hang: j.Hang, Exit: j.Exit, Times: j.Times}
	if j.Code != "" {
		code, ok := parseCode(j.Code)
		if !ok {
			if err := code.UnmarshalJSON([]byte(strconv.Quote(j.Code))); err != nil {
				return fmt.Errorf("%w: unknown code %q", ErrInvalidFault, j.Code)
			}
		}
		r.Code = code
	}
	if j.Delay != "" {
		d, err := time.ParseDuration(j.Delay)
		if err != nil {
			return fmt.Errorf("%w: delay: %w", ErrInvalidFault, err)
		}
		r.Delay = d
	}
	return nil
}

// validate checks that the rule's actions can be combined.
func (r FaultRule) validate() error {
	switch {
	case r.Method == "":
		return errors.New("method is required")
	case r.Exit != "" && r.Exit != ExitBefore && r.Exit != ExitAfter:
		return fmt.Errorf("exit %q is neither %q nor %q", r.Exit, ExitBefore, ExitAfter)
	case r.Hang && (r.Exit != "" || r.Code != codes.OK):
		return errors.New("hang cannot be combined with exit or code")
	case r.Code != codes.OK && r.Exit == ExitAfter:
		return errors.New("code cannot be combined with exit after: the call's own result is what returns")
	case r.Code > codes.Unauthenticated:
		return fmt.Errorf("code %d is not a gRPC code", r.Code)
	case r.Delay < 0 || r.Times < 0:
		return errors.New("delay and times must not be negative")
	}
	return nil
}

// HealthReport is one adverse health condition NodeGetVolumeHealth reports.
type HealthReport struct {
	// Status is a CSI VolumeHealthErrorType name: DEGRADED, INACCESSIBLE or DATA_LOSS.
	Status string `json:"status"`
	// Reason is a CamelCase reason; required.
	Reason string `json:"reason"`
	// Message is for people.
	Message string `json:"message,omitempty"`
}

// FaultConfig is the content of the control file.
type FaultConfig struct {
	// Generation is free text; changing it resets the Times counters even when the rules stay the same.
	Generation string `json:"generation,omitempty"`
	// Rules are tried in order; the first matching rule that has not used up its Times fires.
	Rules []FaultRule `json:"rules"`
	// VolumeHealth makes NodeGetVolumeHealth report a health condition for the volumes named by ID
	// (with the VolumeHealth capability).
	VolumeHealth map[string]HealthReport `json:"volumeHealth,omitempty"`
	// MaxVolumesPerNode, when set, replaces Config.MaxVolumesPerNode while the file says so:
	// NodeGetInfo reports it and ControllerPublishVolume enforces it, as a driver whose limit changes
	// at run time (KEP-4876).
	MaxVolumesPerNode *int64 `json:"maxVolumesPerNode,omitempty"`
	// Bugs switch on driver bugs (see Bug): behaviours a real node plugin gets wrong, for the tests of
	// `csi-volmgr check`, each of which one of its scenarios must catch.
	Bugs []Bug `json:"bugs,omitempty"`
	// Strict makes the node service behave as stock drivers do where they are less forgiving than
	// the plugin (within the CSI spec, so no scenario of `csi-volmgr check` fails on it):
	//   - NodePublishVolume stats its target first and fails (Internal, "stat <target>: transport
	//     endpoint is not connected") when the target is a broken mount, as a stock FUSE driver does,
	//     instead of replacing the broken mount;
	//   - a NodePublishVolume at a target the plugin records but that is not a mount point records it
	//     once more, and a NodeUnpublishVolume removes one record, as csi-driver-host-path does: a
	//     target published over without an unpublish keeps a record after the pod went, and every
	//     NodeUnstageVolume is refused (FailedPrecondition, still published).
	Strict bool `json:"strict,omitempty"`
	// RequireNodeSecrets are keys NodeStageVolume and NodePublishVolume require in their secrets, as
	// drivers that take their credentials from nodeStageSecretRef or nodePublishSecretRef do (the
	// JuiceFS CSI driver needs metaurl, name, storage and bucket): a call without one of them fails
	// with InvalidArgument naming the missing key, never its value.
	RequireNodeSecrets []string `json:"requireNodeSecrets,omitempty"`
	// RequireAccessibility makes CreateVolume of a plugin with a Topology fail (Internal, "can not
	// find any node") when its request has no accessibility requirements, as TopoLVM's controller
	// does: a node-local volume is created on the node the CO names, never on one it guesses.
	RequireAccessibility bool `json:"requireAccessibility,omitempty"`
	// FilesystemOnly makes CreateVolume refuse block volumes (InvalidArgument), as filesystem-only
	// drivers (JuiceFS, NFS, the FUSE drivers) do.
	FilesystemOnly bool `json:"filesystemOnly,omitempty"`
}

// Validate checks every rule. Its errors wrap ErrInvalidFault.
func (c FaultConfig) Validate() error {
	for id, r := range c.VolumeHealth {
		if _, ok := csi.VolumeHealthErrorType_value[r.Status]; !ok || r.Reason == "" {
			return fmt.Errorf("%w: volume health of %s: status %q is not a CSI VolumeHealthErrorType or reason is empty", ErrInvalidFault, id, r.Status)
		}
	}
	if c.MaxVolumesPerNode != nil && *c.MaxVolumesPerNode < 0 {
		return fmt.Errorf("%w: maxVolumesPerNode %d is negative", ErrInvalidFault, *c.MaxVolumesPerNode)
	}
	for _, b := range c.Bugs {
		if !slices.Contains(AllBugs(), b) {
			return fmt.Errorf("%w: unknown bug %q", ErrInvalidFault, b)
		}
	}
	for i, r := range c.Rules {
		if err := r.validate(); err != nil {
			return fmt.Errorf("%w %d: %w", ErrInvalidFault, i, err)
		}
	}
	return nil
}

// WriteFaultConfig validates c and atomically replaces the control file at p with it.
// A running plugin applies it from the next call on.
func WriteFaultConfig(p string, c FaultConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Rules == nil {
		c.Rules = []FaultRule{}
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode fault config: %w", err)
	}
	return writeFileAtomic(p, data, 0o644)
}

// faultInjector applies the control file's rules to calls. It reads the file on every call, which
// costs a few microseconds for a small file, and parses it only when its bytes changed. Comparing
// bytes rather than stat data cannot miss a change, however fast the file is rewritten.
type faultInjector struct {
	controlFile string
	countsFile  string
	journal     *journal
	// exit kills the process; tests replace it.
	exit func()

	// mu guards the fields below and makes "match and count" atomic.
	mu      sync.Mutex
	loaded  bool
	content []byte
	rules   []FaultRule
	// health and maxVolumes are the file's VolumeHealth and MaxVolumesPerNode.
	health     map[string]HealthReport
	maxVolumes *int64
	bugs       []Bug
	strict     bool
	secrets    []string
	fsOnly     bool
	needTopo   bool
	// key is the hash of the control file content; fired counts are kept per key.
	key   string
	fired []int
}

func newFaultInjector(controlFile, stateDir string, j *journal) *faultInjector {
	return &faultInjector{
		controlFile: controlFile,
		countsFile:  filepath.Join(stateDir, faultCountsFile),
		journal:     j,
		exit:        killSelf,
	}
}

// killSelf ends the process the hard way: no deferred work, no graceful gRPC stop, sockets left behind.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// interceptor applies the first matching rule to a unary call.
func (f *faultInjector) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if f == nil {
		return handler(ctx, req)
	}
	method := path.Base(info.FullMethod)
	volumeID := ""
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		volumeID = r.GetVolumeId()
	}
	rule, ok := f.match(ctx, method, volumeID)
	if !ok {
		return handler(ctx, req)
	}
	seq, _ := ctx.Value(callKey{}).(uint64)
	note := func(action, code string) {
		klog.FromContext(ctx).Info("Injecting fault", "method", method, "volume", volumeID, "action", action)
		f.journal.recordOrLog(ctx, Entry{Seq: seq, Event: EventFault, Method: method, VolumeID: volumeID, Message: action, Code: code})
	}

	if rule.Delay > 0 {
		note("delay "+rule.Delay.String(), "")
		t := time.NewTimer(rule.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if rule.Hang {
		note("hang", "")
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if rule.Exit == ExitBefore {
		note("exit-before", "")
		f.exit()
	}
	if rule.Code != codes.OK {
		note("error", rule.Code.String())
		msg := rule.Message
		if msg == "" {
			msg = "injected fault"
		}
		return nil, status.Error(rule.Code, msg)
	}
	resp, err := handler(ctx, req)
	if rule.Exit == ExitAfter {
		note("exit-after", status.Code(err).String())
		f.exit()
	}
	return resp, err
}

// match returns the first rule for the call that has firings left, and counts the firing.
func (f *faultInjector) match(ctx context.Context, method, volumeID string) (FaultRule, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	for i, r := range f.rules {
		if (r.Method != "*" && r.Method != method) || (r.VolumeID != "" && r.VolumeID != volumeID) {
			continue
		}
		if r.Times > 0 {
			if f.fired[i] >= r.Times {
				continue
			}
			f.fired[i]++
			if err := f.saveCountsLocked(); err != nil {
				klog.FromContext(ctx).Error(err, "Failed to save fault counts")
			}
		}
		return r, true
	}
	return FaultRule{}, false
}

// reloadLocked re-reads the control file and takes its rules if it changed. A missing file means
// no rules; an unreadable or invalid one is logged and also means no rules.
func (f *faultInjector) reloadLocked(ctx context.Context) {
	data, err := os.ReadFile(f.controlFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		klog.FromContext(ctx).Error(err, "Failed to read fault control file", "path", f.controlFile)
	}
	if f.loaded && bytes.Equal(data, f.content) {
		return
	}
	f.loaded, f.content, f.rules, f.fired, f.health, f.maxVolumes, f.bugs, f.strict, f.secrets, f.fsOnly, f.needTopo = true, data, nil, nil, nil, nil, nil, false, nil, false, false
	if len(data) == 0 {
		return
	}
	var cfg FaultConfig
	err = json.Unmarshal(data, &cfg)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Ignoring invalid fault control file", "path", f.controlFile)
		return
	}
	sum := sha256.Sum256(data)
	f.key = hex.EncodeToString(sum[:])
	f.rules = cfg.Rules
	f.health, f.maxVolumes, f.bugs, f.strict, f.secrets, f.fsOnly = cfg.VolumeHealth, cfg.MaxVolumesPerNode, cfg.Bugs, cfg.Strict, cfg.RequireNodeSecrets, cfg.FilesystemOnly
	f.needTopo = cfg.RequireAccessibility
	f.fired = make([]int, len(cfg.Rules))
	if counts, err := f.loadCounts(); err != nil {
		klog.FromContext(ctx).Error(err, "Failed to load fault counts")
	} else if counts.Key == f.key {
		copy(f.fired, counts.Fired)
	}
	klog.FromContext(ctx).V(2).Info("Loaded fault rules", "rules", len(f.rules), "generation", cfg.Generation)
}

type faultCounts struct {
	Key   string `json:"key"`
	Fired []int  `json:"fired"`
}

func (f *faultInjector) loadCounts() (faultCounts, error) {
	var c faultCounts
	data, err := os.ReadFile(f.countsFile)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read fault counts: %w", err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("decode fault counts: %w", err)
	}
	return c, nil
}

func (f *faultInjector) saveCountsLocked() error {
	data, err := json.Marshal(faultCounts{Key: f.key, Fired: f.fired})
	if err != nil {
		return fmt.Errorf("encode fault counts: %w", err)
	}
	return writeFileAtomic(f.countsFile, data, 0o600)
}

// volumeHealth returns the health condition the control file sets for volume id.
func (f *faultInjector) volumeHealth(ctx context.Context, id string) (HealthReport, bool) {
	if f == nil {
		return HealthReport{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	r, ok := f.health[id]
	return r, ok
}

// maxVolumesOverride returns the control file's MaxVolumesPerNode, if it sets one.
func (f *faultInjector) maxVolumesOverride(ctx context.Context) (int64, bool) {
	if f == nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	if f.maxVolumes == nil {
		return 0, false
	}
	return *f.maxVolumes, true
}

// hasBug says whether the control file switches bug b on.
func (f *faultInjector) hasBug(ctx context.Context, b Bug) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	return slices.Contains(f.bugs, b)
}

// isStrict says whether the control file sets Strict.
func (f *faultInjector) isStrict(ctx context.Context) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	return f.strict
}

// missingSecret returns the first key of RequireNodeSecrets that secrets lack, "" when none does.
func (f *faultInjector) missingSecret(ctx context.Context, secrets map[string]string) string {
	if f == nil {
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	for _, k := range f.secrets {
		if _, ok := secrets[k]; !ok {
			return k
		}
	}
	return ""
}

// filesystemOnly says whether the control file sets FilesystemOnly.
func (f *faultInjector) filesystemOnly(ctx context.Context) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	return f.fsOnly
}

// requireAccessibility says whether the control file sets RequireAccessibility.
func (f *faultInjector) requireAccessibility(ctx context.Context) bool {
	if f == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadLocked(ctx)
	return f.needTopo
}
