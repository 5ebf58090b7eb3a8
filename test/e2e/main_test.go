package e2e_test

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

// Timeouts of the waits. They are generous: the machine is small and
// shared, and a wait that succeeds returns as soon as its condition holds.
const (
	waitTimeout  = 60 * time.Second
	pollInterval = 20 * time.Millisecond
)

// agentOptions tune an in-process agent.
type agentOptions struct {
	// CSITimeout is the per-call timeout of the driver clients; 0 means
	// csiclient's default.
	CSITimeout time.Duration
	// RetryBaseDelay and RetryMaxDelay bound the reconciler's per-key
	// backoff; 0 means 50ms and 1s, which keeps retries out of the tests'
	// way.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// Changes tunes what the agent does for volumes that change while in
	// use (stats period, mount checks, republish).
	Changes volumemanager.ChangesConfig
	// SELinux is the agent's SELinux translator; nil asks the host.
	SELinux selinux.Translator
	// SettledObjectResync is the agent's period of reading settled
	// objects again; 0 means 1s: the agent's default way (no watch once
	// an object settled), with a change seen within 1.5 s rather than
	// the default period's 3 min; negative watches every object.
	SettledObjectResync time.Duration
}

// agent is csi-volmgr run in the test process: the volume manager the
// csi-volmgr command runs, built from its Config.
type agent struct {
	f *k8stest.Fixture
	// Base holds Root and nothing else the agent makes; the tests check
	// that nothing appears in it outside Root.
	Base string
	// Root is the agent's --root-dir.
	Root string
	// RegDir is the plugin-registration directory, <Root>/plugins_registry.
	RegDir string
	// VM is the running volume manager.
	VM *volumemanager.VolumeManager
}

// newAgentDirs makes a short root directory for an agent (unix socket paths
// below it must stay under 108 bytes) and removes it when the test ends,
// after everything registered later (the plugins, which unmount their
// volumes) has been cleaned up. It refuses to remove a tree that still has
// mounts in it.
func newAgentDirs(t *testing.T) (base, root string) {
	t.Helper()
	base, err := os.MkdirTemp("", "e2e")
	if err != nil {
		t.Fatal(err)
	}
	root = filepath.Join(base, "r")
	if err := os.MkdirAll(filepath.Join(root, "plugins_registry"), 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mounts, err := mountsUnder(base)
		if err != nil {
			t.Errorf("reading the mount table: %v", err)
			return
		}
		if len(mounts) > 0 {
			t.Errorf("mounts left under %s after the test: %v (directory kept)", base, mounts)
			return
		}
		if err := os.RemoveAll(base); err != nil {
			t.Errorf("removing %s: %v", base, err)
		}
	})
	return base, root
}

// startAgent runs an agent for node f.NodeName until the test ends. The
// Node must exist (f.CreateNode) for volumesInUse to be written.
func startAgent(t *testing.T, f *k8stest.Fixture, opts agentOptions) *agent {
	t.Helper()
	base, root := newAgentDirs(t)
	a := &agent{f: f, Base: base, Root: root, RegDir: filepath.Join(root, "plugins_registry")}

	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithName("agent"))
	vm, err := volumemanager.New(ctx, volumemanager.Config{
		NodeName: f.NodeName, RootDir: root, KubeClient: f.Client, CSITimeout: opts.CSITimeout, Changes: opts.Changes,
		SettledObjectResync: cmp.Or(opts.SettledObjectResync, time.Second),
		Tuning: volumemanager.Tuning{
			Reconciler: reconciler.Config{
				RetryBaseDelay: cmp.Or(opts.RetryBaseDelay, 50*time.Millisecond), RetryMaxDelay: cmp.Or(opts.RetryMaxDelay, time.Second),
				ShutdownGrace: 5 * time.Second,
			},
			RegistryRetryBaseDelay: 50 * time.Millisecond, RegistryRetryMaxDelay: time.Second,
			SELinux: opts.SELinux,
		},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	a.VM = vm
	errs := make(chan error, 1)
	stopped := make(chan struct{})
	go func() { errs <- vm.Run(ctx); close(stopped) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("agent stopped with an error: %v", err)
		}
	})
	eventually(t, "agent ready", func() (bool, error) {
		select {
		case <-stopped:
			t.Fatal("the volume manager stopped before it was ready")
		default:
		}
		return a.VM.Ready(), nil
	})
	return a
}

// eventually polls cond until it returns true, failing the test when it
// returns an error or waitTimeout passes.
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := cond()
		if err != nil {
			lastErr = err
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", waitTimeout, what, lastErr)
		case <-tick.C:
		}
	}
}

// mountsUnder returns the mount points at or below dir, from
// /proc/self/mountinfo.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("reading mountinfo: %w", err)
	}
	return out, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// gauge returns the value of the lifecycle gauge name with the given
// labels, and whether the series exists.
func (a *agent) gauge(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	m := a.metric(t, name, labels)
	return m.GetGauge().GetValue(), m != nil
}

// counter returns the value of the lifecycle counter name with the given
// labels, 0 when the series does not exist.
func (a *agent) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return a.metric(t, name, labels).GetCounter().GetValue()
}

// metric returns the series of the lifecycle metric name with the given
// labels, nil when there is none.
func (a *agent) metric(t *testing.T, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := a.VM.Metrics().Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelsMatch(m.GetLabel(), labels) {
				return m
			}
		}
	}
	return nil
}

func labelsMatch(got []*dto.LabelPair, want map[string]string) bool {
	n := 0
	for _, l := range got {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// waitDesired waits until volume_manager_total_volumes says the agent's
// desired state holds n (volume, pod) pairs of driver.
func (a *agent) waitDesired(t *testing.T, driver string, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d desired volumes of %s", n, driver), func() (bool, error) {
		v, _ := a.gauge(t, "volume_manager_total_volumes", map[string]string{
			"plugin_name": "kubernetes.io/csi:" + driver, "state": "desired_state_of_world",
		})
		if int(v) != n {
			return false, fmt.Errorf("volume_manager_total_volumes{state=desired_state_of_world} = %v", v)
		}
		return true, nil
	})
}
