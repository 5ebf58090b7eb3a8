package agenttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/mount-utils"
)

const (
	// startTimeout bounds the wait for a started agent to serve /healthz, when the context has no deadline.
	startTimeout = 60 * time.Second
	// stopTimeout bounds the wait for the agent to exit after SIGTERM before it is killed.
	stopTimeout = 45 * time.Second
	// pollInterval is how often the HTTP API is asked again while waiting on it.
	pollInterval = 20 * time.Millisecond
	// logTail is how much of the agent's log a failed test prints.
	logTail = 32 << 10
	// defaultVerbosity is the agent's -v unless Options say otherwise: every step and its outcome.
	defaultVerbosity = 4
)

// Options configures an agent. KubeConfig and NodeName are required.
type Options struct {
	// KubeConfig is the content of the kubeconfig the agent uses, e.g. k8stest.Env.KubeConfig.
	KubeConfig []byte
	// NodeName is --node-name.
	NodeName string
	// CSITimeout is --csi-timeout; 0 keeps the agent's default.
	CSITimeout time.Duration
	// Verbosity is the agent's -v; 0 means 4.
	Verbosity int
	// ExtraArgs are appended to the command line of `csi-volmgr run`.
	ExtraArgs []string
}

// Agent is a handle on one agent process and its successors after Restart, all over the same
// root directory, registration directory and HTTP endpoint. Its methods are safe for concurrent use.
type Agent struct {
	// Dir holds the root directory, the kubeconfig and the log. Its path is short, so that
	// registration sockets below it stay within the unix socket path limit.
	Dir string
	// RootDir is --root-dir; RegistrationDir is --registration-dir (<RootDir>/plugins_registry).
	RootDir, RegistrationDir string
	// HTTPEndpoint is --http-endpoint, a free 127.0.0.1 port.
	HTTPEndpoint string
	// KubeconfigPath and LogFile are the files the agent reads and writes.
	KubeconfigPath, LogFile string

	binary string
	args   []string
	tb     testing.TB

	// mu guards the fields below, which change with every (re)start.
	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	gen      int
	stopOnce sync.Once
}

// New builds the binary if needed and prepares an agent for tb without starting it: a directory,
// the kubeconfig, a free port. Start it with Start once the plugins it should find can register
// into RegistrationDir. When tb ends, the agent is stopped with SIGTERM (a non-zero exit, e.g. a
// race report, fails tb), whatever is still mounted below Dir is unmounted, and Dir is removed.
// When tb failed, the end of the agent's log is printed.
func New(tb testing.TB, opts Options) *Agent {
	tb.Helper()
	a, err := Prepare(opts)
	if err != nil {
		tb.Fatalf("prepare agent: %v", err)
	}
	a.tb = tb
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("agent log (%s), last %d bytes:\n%s", a.LogFile, logTail, a.TailLog())
		}
		if err := a.Close(); err != nil {
			tb.Errorf("close agent: %v", err)
		}
	})
	return a
}

// Prepare is New without a testing.TB: the caller owns the result and must Close it.
func Prepare(opts Options) (*Agent, error) {
	if len(opts.KubeConfig) == 0 || opts.NodeName == "" {
		return nil, errors.New("agenttest: KubeConfig and NodeName are required")
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		return nil, fmt.Errorf("create agent directory: %w", err)
	}
	a := &Agent{
		Dir:            dir,
		RootDir:        filepath.Join(dir, "root"),
		KubeconfigPath: filepath.Join(dir, "kubeconfig"),
		LogFile:        filepath.Join(dir, "agent.log"),
		binary:         bin,
	}
	a.RegistrationDir = filepath.Join(a.RootDir, "plugins_registry")
	if err := os.MkdirAll(a.RegistrationDir, 0o750); err != nil {
		return nil, errors.Join(fmt.Errorf("create registration directory: %w", err), os.RemoveAll(dir))
	}
	if err := os.WriteFile(a.KubeconfigPath, opts.KubeConfig, 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("write kubeconfig: %w", err), os.RemoveAll(dir))
	}
	if a.HTTPEndpoint, err = freeAddress(); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	verbosity := opts.Verbosity
	if verbosity == 0 {
		verbosity = defaultVerbosity
	}
	a.args = []string{
		"run",
		"--kubeconfig=" + a.KubeconfigPath,
		"--node-name=" + opts.NodeName,
		"--root-dir=" + a.RootDir,
		"--registration-dir=" + a.RegistrationDir,
		"--http-endpoint=" + a.HTTPEndpoint,
		"--v=" + strconv.Itoa(verbosity),
	}
	if opts.CSITimeout > 0 {
		a.args = append(a.args, "--csi-timeout="+opts.CSITimeout.String())
	}
	a.args = append(a.args, opts.ExtraArgs...)
	return a, nil
}

// freeAddress returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// Start runs a new agent process and waits until it serves /healthz. It fails if the process
// exits first or if a process of this Agent still runs.
func (a *Agent) Start(ctx context.Context) error {
	if a.Running() {
		return errors.New("agenttest: the agent is already running")
	}
	logFile, err := os.OpenFile(a.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open agent log: %w", err)
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(a.binary, a.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Do not outlive the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	a.mu.Lock()
	gen := a.gen + 1
	a.mu.Unlock()
	_, _ = fmt.Fprintf(logFile, "=== agenttest: start %d: %s %s\n", gen, a.binary, strings.Join(a.args, " "))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", a.binary, err)
	}
	exited := make(chan struct{})
	a.mu.Lock()
	a.cmd, a.exited, a.waitErr, a.gen = cmd, exited, nil, gen
	a.mu.Unlock()
	if gen == 1 && a.tb != nil {
		// Registered after the plugins' cleanups, so it runs before them:
		// the agent goes first, as on a node that is drained.
		a.tb.Cleanup(func() {
			if err := a.stopOnceForCleanup(); err != nil {
				a.tb.Errorf("stop agent: %v", err)
			}
		})
	}
	go func() {
		err := cmd.Wait()
		a.mu.Lock()
		if a.gen == gen {
			a.waitErr = err
		}
		a.mu.Unlock()
		close(exited)
	}()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	serving := make(chan error, 1)
	go func() {
		serving <- pollUntil(ctx, func(ctx context.Context) (bool, error) {
			code, _, err := a.Get(ctx, "/healthz")
			return err == nil && code == 200, nil
		})
	}()
	select {
	case err := <-serving:
		if err != nil {
			return fmt.Errorf("agent (pid %d) did not serve /healthz: %w; log:\n%s", cmd.Process.Pid, err, a.TailLog())
		}
		return nil
	case <-exited:
		return fmt.Errorf("agent (pid %d) exited during start: %w; log:\n%s", cmd.Process.Pid, a.ExitErr(), a.TailLog())
	}
}

// stopOnceForCleanup stops a running agent once, at the end of the test.
func (a *Agent) stopOnceForCleanup() error {
	var err error
	a.stopOnce.Do(func() {
		if a.Running() {
			err = a.Stop()
		}
	})
	return err
}

// PID returns the process ID of the current agent process; 0 before the first Start.
func (a *Agent) PID() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return 0
	}
	return a.cmd.Process.Pid
}

// Exited returns a channel that is closed when the current agent process exits; nil before
// the first Start.
func (a *Agent) Exited() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exited
}

// Running reports whether the current agent process is alive.
func (a *Agent) Running() bool {
	ch := a.Exited()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// ExitErr returns the result of the exited process as exec.Cmd.Wait reported it (nil for exit
// code 0). It is nil while the process runs.
func (a *Agent) ExitErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waitErr
}

// Kill sends SIGKILL and waits for the process to go, as a crash would: mounts, records and
// CSI calls in flight stay as they are. Killing an exited agent does nothing.
func (a *Agent) Kill() error {
	a.mu.Lock()
	cmd, exited := a.cmd, a.exited
	a.mu.Unlock()
	if cmd == nil {
		return errors.New("agenttest: the agent was never started")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill agent: %w", err)
	}
	<-exited
	return nil
}

// Stop sends SIGTERM and waits for the agent to exit. It returns an error if the exit is not
// clean (a race report makes the exit code 66) or the agent must be killed after 45s.
// Stopping an exited agent returns that process's exit error.
func (a *Agent) Stop() error {
	a.mu.Lock()
	cmd, exited := a.cmd, a.exited
	a.mu.Unlock()
	if cmd == nil {
		return errors.New("agenttest: the agent was never started")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal agent: %w", err)
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("agent (pid %d) did not exit within %v of SIGTERM", cmd.Process.Pid, stopTimeout)
	}
	if err := a.ExitErr(); err != nil {
		return fmt.Errorf("agent (pid %d) exited: %w", cmd.Process.Pid, err)
	}
	return nil
}

// Restart stops the agent gracefully if it still runs, then starts it again with the same
// command line, over the same root directory and HTTP endpoint.
func (a *Agent) Restart(ctx context.Context) error {
	if a.Running() {
		if err := a.Stop(); err != nil {
			return err
		}
	}
	return a.Start(ctx)
}

// Close stops the agent if it still runs, unmounts whatever is still mounted below Dir (deepest
// first) and removes Dir. A mount that cannot be unmounted keeps Dir in place for inspection.
func (a *Agent) Close() error {
	var errs []error
	if err := a.stopOnceForCleanup(); err != nil {
		errs = append(errs, err)
	}
	if err := unmountBelow(a.Dir); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := os.RemoveAll(a.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove agent directory: %w", err))
	}
	return errors.Join(errs...)
}

// MountsBelow lists the mount points strictly below dir in the mount table of this process.
func MountsBelow(dir string) ([]string, error) {
	mps, err := mount.New("").List()
	if err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	var out []string
	for _, mp := range mps {
		if strings.HasPrefix(mp.Path, dir+"/") {
			out = append(out, mp.Path)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func unmountBelow(dir string) error {
	mounter := mount.New("")
	var errs []error
	// A path mounted more than once needs one pass per mount.
	for range 5 {
		mps, err := MountsBelow(dir)
		if err != nil || len(mps) == 0 {
			return err
		}
		// Deepest first, so that no mount hides another.
		slices.SortFunc(mps, func(x, y string) int { return len(y) - len(x) })
		errs = errs[:0]
		for _, mp := range mps {
			if err := mounter.Unmount(mp); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
			}
		}
	}
	if mps, err := MountsBelow(dir); err != nil || len(mps) > 0 {
		return errors.Join(append(errs, err, fmt.Errorf("still mounted below %s: %v", dir, mps))...)
	}
	return nil
}

// TailLog returns the end of the agent's log, of every process so far.
func (a *Agent) TailLog() string {
	data, err := os.ReadFile(a.LogFile)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if len(data) > logTail {
		data = data[len(data)-logTail:]
	}
	return string(data)
}
