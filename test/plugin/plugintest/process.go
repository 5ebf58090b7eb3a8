package plugintest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

const (
	// DefaultNodeID is the node ID a plugin started without Options.NodeID reports.
	DefaultNodeID = "testnode"
	// startTimeout bounds the wait for a started plugin to serve, when the context has no deadline.
	startTimeout = 60 * time.Second
	// stopTimeout bounds the wait for a plugin to exit after SIGTERM before it is killed.
	stopTimeout = 30 * time.Second
	// pollInterval is how often the journal is re-read while waiting on it.
	pollInterval = 10 * time.Millisecond
	// logTail is how much of the plugin's log a failed test prints.
	logTail = 16 << 10
)

// Options configures a plugin process. The zero value starts a plugin with default capabilities in
// a fresh temporary directory.
type Options struct {
	// Name is the driver name; default plugin.DefaultName.
	Name string
	// NodeID is the node ID; default DefaultNodeID.
	NodeID string
	// Capabilities selects the optional capabilities; nil means plugin.DefaultCapabilities().
	Capabilities *plugin.Capabilities
	// RegistrationDir, when set, makes the plugin serve <RegistrationDir>/<Name>-reg.sock.
	RegistrationDir string
	// MaxVolumesPerNode is the node's volume limit; 0 for none.
	MaxVolumesPerNode int64
	// Topology is the node's accessible topology.
	Topology map[string]string
	// Capacity is the total capacity in bytes; 0 means plugin.DefaultCapacity.
	Capacity int64
	// Dir holds the socket, state, journal, control file and log unless they are given separately.
	// Default: a new directory under os.TempDir with a short path (unix socket paths are limited to
	// 107 bytes), removed by Close.
	Dir string
	// StateDir is the plugin's state directory; default <Dir>/state.
	StateDir string
	// Endpoint is the CSI socket path; default <Dir>/csi.sock.
	Endpoint string
	// Verbosity is the plugin's klog -v level; 0 means 5, which logs every request and response.
	Verbosity int
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// Plugin is a handle on one plugin process (and its successors after Restart).
// Its methods are safe for concurrent use.
type Plugin struct {
	// Endpoint is the CSI socket path.
	Endpoint string
	// RegistrationSocket is the plugin-registration socket path, "" without Options.RegistrationDir.
	RegistrationSocket string
	// Dir, StateDir, JournalPath, ControlFile and LogFile are where the plugin keeps its files.
	Dir, StateDir, JournalPath, ControlFile, LogFile string
	// Name and NodeID are the driver name and node ID the plugin reports.
	Name, NodeID string

	binary  string
	args    []string
	ownsDir bool

	// mu guards the fields below, which change with every (re)start.
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	gen     int
}

// Start launches a plugin for a test and registers its Close with t.Cleanup. When the test has
// failed, the end of the plugin's log is printed first. Create directories the plugin will mount
// into before calling Start (or clean them up yourself): cleanups run last-in first-out, and a
// t.TempDir registered after Start would be removed while still mounted.
func Start(t testing.TB, opts Options) *Plugin {
	t.Helper()
	p, err := Launch(t.Context(), opts)
	if err != nil {
		t.Fatalf("start test plugin: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("test plugin log (%s), last %d bytes:\n%s", p.LogFile, logTail, p.tailLog())
		}
		if err := p.Close(); err != nil {
			t.Errorf("close test plugin: %v", err)
		}
	})
	return p
}

// Launch builds the binary if needed, starts the plugin and waits until it serves its endpoint
// (and registration socket). The caller owns the result and must Close it.
func Launch(ctx context.Context, opts Options) (*Plugin, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	p := &Plugin{binary: bin, Name: opts.Name, NodeID: opts.NodeID, Dir: opts.Dir}
	if p.Name == "" {
		p.Name = plugin.DefaultName
	}
	if p.NodeID == "" {
		p.NodeID = DefaultNodeID
	}
	if p.Dir == "" {
		if p.Dir, err = os.MkdirTemp("", "tp"); err != nil {
			return nil, fmt.Errorf("create plugin directory: %w", err)
		}
		p.ownsDir = true
	} else if err := os.MkdirAll(p.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugin directory: %w", err)
	}
	p.StateDir, p.Endpoint = opts.StateDir, opts.Endpoint
	if p.StateDir == "" {
		p.StateDir = filepath.Join(p.Dir, "state")
	}
	if p.Endpoint == "" {
		p.Endpoint = filepath.Join(p.Dir, "csi.sock")
	}
	p.JournalPath = filepath.Join(p.Dir, "journal.jsonl")
	p.ControlFile = filepath.Join(p.Dir, "faults.json")
	p.LogFile = filepath.Join(p.Dir, "plugin.log")
	if opts.RegistrationDir != "" {
		p.RegistrationSocket = plugin.RegistrationSocket(opts.RegistrationDir, p.Name)
	}
	p.args = p.commandLine(opts)

	if err := p.start(ctx); err != nil {
		return nil, errors.Join(err, p.Close())
	}
	return p, nil
}

func (p *Plugin) commandLine(opts Options) []string {
	caps := plugin.DefaultCapabilities()
	if opts.Capabilities != nil {
		caps = *opts.Capabilities
	}
	verbosity := opts.Verbosity
	if verbosity == 0 {
		verbosity = 5
	}
	flag := func(name string, on bool) string { return "--" + name + "=" + strconv.FormatBool(on) }
	args := []string{
		"--endpoint=" + p.Endpoint,
		"--name=" + p.Name,
		"--node-id=" + p.NodeID,
		"--state-dir=" + p.StateDir,
		"--journal=" + p.JournalPath,
		"--control-file=" + p.ControlFile,
		"--max-volumes-per-node=" + strconv.FormatInt(opts.MaxVolumesPerNode, 10),
		"--v=" + strconv.Itoa(verbosity),
		flag("node-stage-unstage", caps.StageUnstage),
		flag("node-expand-volume", caps.Expand),
		flag("node-get-volume-stats", caps.VolumeStats),
		flag("node-volume-mount-group", caps.VolumeMountGroup),
		flag("single-node-multi-writer", caps.SingleNodeMultiWriter),
		flag("controller-publish-unpublish", caps.ControllerPublish),
	}
	if opts.Capacity > 0 {
		args = append(args, "--capacity="+strconv.FormatInt(opts.Capacity, 10))
	}
	if len(opts.Topology) > 0 {
		args = append(args, "--topology="+plugin.FormatTopology(opts.Topology))
	}
	if opts.RegistrationDir != "" {
		args = append(args, "--registration-dir="+opts.RegistrationDir)
	}
	return append(args, opts.ExtraArgs...)
}

// start runs a new process and waits for its "start" journal entry, written once its sockets listen.
func (p *Plugin) start(ctx context.Context) error {
	logFile, err := os.OpenFile(p.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open plugin log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(p.binary, p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Do not outlive the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", p.binary, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.waitErr = cmd, exited, nil
	p.gen++
	gen := p.gen
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		if p.gen == gen {
			p.waitErr = err
		}
		p.mu.Unlock()
		close(exited)
	}()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	pid := cmd.Process.Pid
	ready := make(chan error, 1)
	go func() {
		_, err := p.WaitForJournal(ctx, func(entries []plugin.Entry) bool {
			for _, e := range entries {
				if e.Event == plugin.EventStart && e.PID == pid {
					return true
				}
			}
			return false
		})
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			return fmt.Errorf("plugin (pid %d) did not start serving: %w; log:\n%s", pid, err, p.tailLog())
		}
		return nil
	case <-exited:
		return fmt.Errorf("plugin (pid %d) exited during start: %w; log:\n%s", pid, p.ExitErr(), p.tailLog())
	}
}

// PID returns the process ID of the current plugin process.
func (p *Plugin) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Exited returns a channel that is closed when the current plugin process exits, e.g. after a
// fault rule with "exit" fired.
func (p *Plugin) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Running reports whether the current plugin process is still alive.
func (p *Plugin) Running() bool {
	select {
	case <-p.Exited():
		return false
	default:
		return true
	}
}

// ExitErr returns the result of the exited process as exec.Cmd.Wait reported it (nil for exit code 0).
// It is nil while the process runs.
func (p *Plugin) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Kill sends SIGKILL and waits for the process to go, as a crash would: sockets, mounts and
// loop devices stay behind. Killing an exited plugin does nothing.
func (p *Plugin) Kill() error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill plugin: %w", err)
	}
	<-exited
	return nil
}

// Stop sends SIGTERM and waits for a graceful exit, which removes the sockets. It returns an error
// if the process exits unsuccessfully (a race report makes the exit code 66) or must be killed
// after 30s. Stopping an exited plugin returns that process's exit error.
func (p *Plugin) Stop() error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal plugin: %w", err)
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("plugin (pid %d) did not exit within %v of SIGTERM", cmd.Process.Pid, stopTimeout)
	}
	if err := p.ExitErr(); err != nil {
		return fmt.Errorf("plugin (pid %d) exited: %w", cmd.Process.Pid, err)
	}
	return nil
}

// Restart stops the plugin gracefully if it still runs, then starts it again with the same
// options and state directory and waits until it serves.
func (p *Plugin) Restart(ctx context.Context) error {
	if p.Running() {
		if err := p.Stop(); err != nil {
			return err
		}
	}
	return p.start(ctx)
}

// Dial opens a gRPC client connection to the plugin's CSI endpoint. The caller closes it.
func (p *Plugin) Dial() (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+p.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", p.Endpoint, err)
	}
	return conn, nil
}

// Volumes returns the volumes in the plugin's state file.
func (p *Plugin) Volumes() ([]plugin.Volume, error) {
	return plugin.LoadState(p.StateDir)
}

// Close stops the plugin (SIGTERM, SIGKILL after 30s), unmounts everything that shows one of its
// volumes and detaches its loop devices, and removes Dir if Launch created it.
func (p *Plugin) Close() error {
	var errs []error
	p.mu.Lock()
	started := p.cmd != nil
	p.mu.Unlock()
	if started && p.Running() {
		if err := p.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := plugin.CleanupMounts(p.StateDir); err != nil {
		// Removing Dir now could delete through a mount; leave it for inspection.
		return errors.Join(append(errs, fmt.Errorf("clean up mounts: %w", err))...)
	}
	if p.ownsDir {
		if err := os.RemoveAll(p.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove plugin directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (p *Plugin) tailLog() string {
	data, err := os.ReadFile(p.LogFile)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if len(data) > logTail {
		data = data[len(data)-logTail:]
	}
	return string(data)
}
