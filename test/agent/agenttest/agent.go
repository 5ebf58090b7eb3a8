package agenttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/test/process"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

const (
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
	// Binary, when set, is the csi-volmgr binary to run (e.g. an earlier release's, for the
	// upgrade test) instead of this checkout's (Binary()).
	Binary string
}

// Agent is a handle on one agent process and its successors after Restart, all over the same
// root directory, registration directory and HTTP endpoint. Its methods are safe for concurrent use.
//
// The embedded Process is the agent process: its Kill is a crash (mounts, records and CSI calls
// in flight stay as they are), its Stop a node drain (SIGTERM; an unclean exit is an error, and
// a race report makes the exit code 66; SIGKILL after 45s). Agent's own Start, Restart and Close
// add what the agent needs.
type Agent struct {
	*process.Process

	// Dir holds the root directory, the kubeconfig and the log. Its path is short, so that
	// registration sockets below it stay within the unix socket path limit.
	Dir string
	// RootDir is --root-dir; RegistrationDir is --registration-dir (<RootDir>/plugins_registry).
	RootDir, RegistrationDir string
	// HTTPEndpoint is --http-endpoint, a free 127.0.0.1 port.
	HTTPEndpoint string
	// SocketPath is the agent's API socket, <RootDir>/csi-volmgr.sock.
	SocketPath string
	// KubeconfigPath and LogFile are the files the agent reads and writes.
	KubeconfigPath, LogFile string

	binary string
	// procOpts is how Process was made, for Replace.
	procOpts process.Options
	tb       testing.TB
	// stopRegistered makes stopAtCleanup register the stop once.
	stopRegistered sync.Once
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
			tb.Logf("agent log (%s), last %d bytes:\n%s", a.LogFile, logTail, a.TailLog(logTail))
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
	bin := opts.Binary
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return nil, err
		}
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
	a.SocketPath = volumemanager.SocketPath(a.RootDir)
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
	args := []string{
		"run",
		"--kubeconfig=" + a.KubeconfigPath,
		"--node-name=" + opts.NodeName,
		"--root-dir=" + a.RootDir,
		"--registration-dir=" + a.RegistrationDir,
		"--http-endpoint=" + a.HTTPEndpoint,
		"--v=" + strconv.Itoa(verbosity),
	}
	if opts.CSITimeout > 0 {
		args = append(args, "--csi-timeout="+opts.CSITimeout.String())
	}
	a.procOpts = process.Options{
		Name:        "agent",
		Path:        bin,
		Args:        append(args, opts.ExtraArgs...),
		LogFile:     a.LogFile,
		Ready:       a.serving,
		StopTimeout: stopTimeout,
	}
	a.Process = process.New(a.procOpts)
	return a, nil
}

// Replace stops the agent as a DaemonSet rollout or a package update's restart does (SIGTERM,
// its clean exit awaited) if it still runs, and starts binary in its place with the same
// command line, over the same root directory and HTTP endpoint; the client commands
// (StatusCommand) run binary from then on. Unlike the other methods it must not run
// concurrently with any other method of a.
func (a *Agent) Replace(ctx context.Context, binary string) error {
	if a.Running() {
		if err := a.Stop(); err != nil {
			return err
		}
	}
	a.StartWith(binary)
	return a.Start(ctx)
}

// StartWith makes the next Start run binary: the agent must not run (Stop it first). Like
// Replace, it must not run concurrently with any other method of a.
func (a *Agent) StartWith(binary string) {
	a.procOpts.Path = binary
	a.binary = binary
	a.Process = process.New(a.procOpts)
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

// Start runs a new agent process and waits until it serves /healthz (60s at most when ctx has
// no deadline). It fails if the process exits first or if a process of this Agent still runs;
// an agent that does not serve is killed.
func (a *Agent) Start(ctx context.Context) error {
	a.stopAtCleanup()
	return a.Process.Start(ctx)
}

// stopAtCleanup makes the end of the test stop the agent, once, from the first (re)start on.
// The cleanup is registered after the plugins' cleanups, so it runs before them: the agent goes
// first, as on a node that is drained.
func (a *Agent) stopAtCleanup() {
	if a.tb == nil {
		return
	}
	a.stopRegistered.Do(func() {
		a.tb.Cleanup(func() {
			if err := a.Process.Close(); err != nil {
				a.tb.Errorf("stop agent: %v", err)
			}
		})
	})
}

// serving tells when a started agent is ready: it serves /healthz on its API socket.
func (a *Agent) serving(ctx context.Context, _ int) error {
	return pollUntil(ctx, func(ctx context.Context) (bool, error) {
		code, _, err := a.Get(ctx, HealthzPath)
		return err == nil && code == http.StatusOK, nil
	})
}

// Restart stops the agent gracefully if it still runs, then starts it again with the same
// command line, over the same root directory and HTTP endpoint.
func (a *Agent) Restart(ctx context.Context) error {
	a.stopAtCleanup()
	return a.Process.Restart(ctx)
}

// Close stops the agent if it still runs, unmounts whatever is still mounted below Dir (deepest
// first) and removes Dir. A mount that cannot be unmounted keeps Dir in place for inspection.
func (a *Agent) Close() error {
	var errs []error
	if err := a.Process.Close(); err != nil {
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
