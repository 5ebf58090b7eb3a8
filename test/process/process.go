// Package process owns one child process of a test: it starts the command with its output
// appended to a log file, waits until the process is ready or has exited, kills it the way a
// crash would, stops it the way a node drain would (SIGTERM, then SIGKILL after a timeout),
// starts it again with the same command line, and returns the end of its log for a failed test.
//
// Every started process is reaped by one goroutine that ends when the process exits; Kill, Stop
// and Close return only after it has. The child gets SIGKILL when the test binary dies first
// (Pdeathsig), so a test that is killed does not leave it running either. A process started in
// a process group of its own (Options.ProcessGroup) is signalled as a group, and Close kills
// what is left of the group.
//
//	p := process.New(process.Options{Name: "plugin", Path: bin, Args: args, LogFile: log})
//	if err := p.Start(ctx); err != nil {
//		return err
//	}
//	defer p.Close()
package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// DefaultStartTimeout bounds Start's wait for Options.Ready when its context has no deadline.
	DefaultStartTimeout = 60 * time.Second
	// DefaultStopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL.
	DefaultStopTimeout = 30 * time.Second
	// startErrorLogTail is how much of the log an error of Start carries.
	startErrorLogTail = 16 << 10
)

// ErrNotStarted is what Kill and Stop return before the first Start.
var ErrNotStarted = errors.New("process: not started")

// Options describe the command a Process runs and how it becomes ready. Only Path is required.
type Options struct {
	// Name names the process in errors and in the log, e.g. "agent"; default the base of Path.
	Name string
	// Path is the program to run.
	Path string
	// Args are the arguments, without the program name.
	Args []string
	// Env is the environment of the process; nil means the environment of the test binary.
	Env []string
	// Dir is the working directory; "" means the test binary's.
	Dir string
	// LogFile receives the standard output and standard error of every process started, appended,
	// each after a header line with its command line; "" discards them.
	LogFile string
	// ProcessGroup starts every process in a new process group of its own. Its signals then go
	// to the whole group, and Close kills whatever of the group is still there.
	ProcessGroup bool
	// Ready, when set, tells Start when a started process is ready for the test. It is called
	// with the PID of the new process and must return nil once the process is ready, or an
	// error once ctx ends; ctx ends when Start gives up or the process exits.
	Ready func(ctx context.Context, pid int) error
	// StartTimeout bounds the wait for Ready when Start's context has no deadline; 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before it kills the process; 0 means
	// DefaultStopTimeout.
	StopTimeout time.Duration
}

// Process is a handle on a child process and its successors after Restart, all with the same
// command line and log. Its methods are safe for concurrent use.
type Process struct {
	opts Options

	// mu guards the fields below, which change with every start.
	mu     sync.Mutex
	cur    *run // nil before the first start
	starts int
}

// run is one started process.
type run struct {
	pid    int
	proc   *os.Process
	exited chan struct{}
	// err is what exec.Cmd.Wait returned; written before exited is closed.
	err error
}

// done reports whether the process has exited and been reaped.
func (r *run) done() bool {
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

// New returns a Process for opts without starting it.
func New(opts Options) *Process {
	if opts.Name == "" {
		opts.Name = filepath.Base(opts.Path)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	return &Process{opts: opts}
}

// Start runs a new process and, with Options.Ready, waits until it is ready. It fails if a
// process of p still runs, if the process exits first (the error wraps the exit error, an
// *exec.ExitError), or if Ready fails; then the process is killed. Its errors carry the end of
// the log.
func (p *Process) Start(ctx context.Context) error {
	r, err := p.spawn()
	if err != nil || p.opts.Ready == nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.opts.StartTimeout)
		defer cancel()
	}
	readyCtx, cancelReady := context.WithCancel(ctx)
	defer cancelReady()
	var notReady error // written before ready is closed
	ready := make(chan struct{})
	go func() {
		defer close(ready)
		notReady = p.opts.Ready(readyCtx, r.pid)
	}()
	select {
	case <-ready:
		if notReady == nil {
			return nil
		}
		kerr := p.kill(r)
		return errors.Join(fmt.Errorf("%s (pid %d) did not get ready and was killed: %w; log:\n%s",
			p.opts.Name, r.pid, notReady, p.TailLog(startErrorLogTail)), kerr)
	case <-r.exited:
		cancelReady()
		<-ready
		return fmt.Errorf("%s (pid %d) exited during start: %w; log:\n%s",
			p.opts.Name, r.pid, exitStatus(r.err), p.TailLog(startErrorLogTail))
	}
}

// spawn starts a process and its reaper.
func (p *Process) spawn() (*run, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil && !p.cur.done() {
		return nil, fmt.Errorf("%s (pid %d) is still running", p.opts.Name, p.cur.pid)
	}
	if p.opts.Path == "" {
		return nil, errors.New("process: no Path to run")
	}
	cmd := exec.Command(p.opts.Path, p.opts.Args...)
	cmd.Env, cmd.Dir = p.opts.Env, p.opts.Dir
	// Do not outlive the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: p.opts.ProcessGroup}
	p.starts++
	if p.opts.LogFile != "" {
		log, err := os.OpenFile(p.opts.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open the log of %s: %w", p.opts.Name, err)
		}
		// The child has its own descriptor once started.
		defer func() { _ = log.Close() }()
		_, _ = fmt.Fprintf(log, "=== process: start %d of %s: %s %s\n", p.starts, p.opts.Name, p.opts.Path, strings.Join(p.opts.Args, " "))
		cmd.Stdout, cmd.Stderr = log, log
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.opts.Name, err)
	}
	r := &run{pid: cmd.Process.Pid, proc: cmd.Process, exited: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.exited)
	}()
	p.cur = r
	return r, nil
}

// current returns the latest process; nil before the first start.
func (p *Process) current() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// PID returns the process ID of the latest process; 0 before the first Start.
func (p *Process) PID() int {
	if r := p.current(); r != nil {
		return r.pid
	}
	return 0
}

// Exited returns a channel that is closed when the latest process has exited and been reaped;
// nil before the first Start. A later Start does not close it again: ask again after a restart.
func (p *Process) Exited() <-chan struct{} {
	if r := p.current(); r != nil {
		return r.exited
	}
	return nil
}

// Running reports whether the latest process is alive.
func (p *Process) Running() bool {
	r := p.current()
	return r != nil && !r.done()
}

// ExitErr returns the result of the latest process as exec.Cmd.Wait reported it: nil for exit
// code 0, an *exec.ExitError otherwise. It is nil while the process runs.
func (p *Process) ExitErr() error {
	if r := p.current(); r != nil && r.done() {
		return r.err
	}
	return nil
}

// Kill sends SIGKILL (to the process group with Options.ProcessGroup) and waits until the
// process has gone, as a crash would. Killing an exited process does nothing.
func (p *Process) Kill() error {
	r := p.current()
	if r == nil {
		return ErrNotStarted
	}
	return p.kill(r)
}

func (p *Process) kill(r *run) error {
	if err := p.signal(r, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s (pid %d): %w", p.opts.Name, r.pid, err)
	}
	<-r.exited
	return nil
}

// Stop sends SIGTERM (to the process group with Options.ProcessGroup) and waits for the process
// to exit. It returns an error that wraps the exit error if the exit was not clean (a race report
// makes the exit code 66), and an error after killing the process if it did not exit within
// Options.StopTimeout. Stopping an exited process returns that process's exit error.
func (p *Process) Stop() error {
	r := p.current()
	if r == nil {
		return ErrNotStarted
	}
	return p.stop(r)
}

func (p *Process) stop(r *run) error {
	if err := p.signal(r, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal %s (pid %d): %w", p.opts.Name, r.pid, err)
	}
	t := time.NewTimer(p.opts.StopTimeout)
	defer t.Stop()
	select {
	case <-r.exited:
	case <-t.C:
		if err := p.kill(r); err != nil {
			return err
		}
		return fmt.Errorf("%s (pid %d) did not exit within %v of SIGTERM and was killed", p.opts.Name, r.pid, p.opts.StopTimeout)
	}
	if r.err != nil {
		return fmt.Errorf("%s (pid %d) exited: %w", p.opts.Name, r.pid, r.err)
	}
	return nil
}

// signal sends sig to the process, or to its process group. A process (or group) that is
// gone already is no error.
func (p *Process) signal(r *run, sig syscall.Signal) error {
	if p.opts.ProcessGroup {
		// The group outlives its leader while any member lives.
		if err := syscall.Kill(-r.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	}
	if err := r.proc.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// Restart stops the process as Stop does if it still runs, then starts it again as Start does.
func (p *Process) Restart(ctx context.Context) error {
	if p.Running() {
		if err := p.Stop(); err != nil {
			return err
		}
	}
	return p.Start(ctx)
}

// Close stops the process as Stop does if it still runs and, with Options.ProcessGroup, kills
// what is left of its group. Closing a process that never started or has exited does nothing
// else; Close may be called more than once.
func (p *Process) Close() error {
	r := p.current()
	if r == nil {
		return nil
	}
	var err error
	if !r.done() {
		err = p.stop(r)
	}
	if p.opts.ProcessGroup {
		if kerr := p.signal(r, syscall.SIGKILL); kerr != nil {
			err = errors.Join(err, fmt.Errorf("kill the process group of %s (pid %d): %w", p.opts.Name, r.pid, kerr))
		}
	}
	return err
}

// TailLog returns the last n bytes of the log, of every process so far; a note in parentheses
// when there is no log to read.
func (p *Process) TailLog(n int) string {
	if p.opts.LogFile == "" {
		return "(no log file)"
	}
	f, err := os.Open(p.opts.LogFile)
	if err != nil {
		return fmt.Sprintf("(cannot read the log: %v)", err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(cannot read the log: %v)", err)
	}
	off := max(fi.Size()-int64(max(n, 0)), 0)
	data, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return fmt.Sprintf("(cannot read the log: %v)", err)
	}
	return string(data)
}

// exitStatus returns err, or an error that says the exit was clean when err is nil.
func exitStatus(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}
