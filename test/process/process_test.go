package process_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/process"
)

// helperEnv makes the test binary act as a child process of the tests instead of running them;
// its value is the child's behaviour (see runHelper).
const helperEnv = "PROCESS_TEST_HELPER"

// pollInterval is how often a test looks at the log or /proc again while it waits.
const pollInterval = 5 * time.Millisecond

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

// runHelper is the child process. It prints "ready <pid>" once it handles SIGTERM as its mode
// says:
//   - graceful: exits 0 on SIGTERM, as a well-behaved server does;
//   - ignore-term: prints "ignored SIGTERM" for each SIGTERM and runs on;
//   - exit: prints three lines and exits 3, without "ready";
//   - env: prints its working directory and $PROCESS_TEST_VALUE and exits 0;
//   - group: starts an ignore-term child of its own, prints "child <pid>", and then behaves
//     as graceful.
func runHelper(mode string) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	switch mode {
	case "exit":
		fmt.Println("line 1\nline 2\nline 3")
		return 3
	case "env":
		wd, err := os.Getwd()
		fmt.Printf("wd=%s err=%v value=%s\n", wd, err, os.Getenv("PROCESS_TEST_VALUE"))
		return 0
	case "ignore-term":
		fmt.Println("ready", os.Getpid())
		for range term {
			fmt.Println("ignored SIGTERM")
		}
	case "group":
		child, err := startIgnoreTermChild()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Println("child", child)
		fallthrough
	case "graceful":
		fmt.Println("ready", os.Getpid())
		<-term
		fmt.Println("terminated")
		return 0
	}
	fmt.Println("unknown mode", mode)
	return 2
}

// startIgnoreTermChild starts an ignore-term helper in the caller's process group, writing to
// the caller's standard output, and returns its PID.
func startIgnoreTermChild() (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=ignore-term")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	return cmd.Process.Pid, nil
}

// helper returns the options of a helper child in mode, logging into a file of a fresh
// directory, ready once it printed "ready <pid>".
func helper(t *testing.T, mode string) process.Options {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts := process.Options{
		Name: mode,
		Path: self,
		// Under -race, a clean exit waits 1s for the race detector unless told not to.
		Env:     append(os.Environ(), helperEnv+"="+mode, "GORACE=atexit_sleep_ms=0"),
		LogFile: filepath.Join(t.TempDir(), "child.log"),
	}
	opts.Ready = func(ctx context.Context, pid int) error {
		return waitFor(ctx, func() bool { return strings.Contains(readFile(t, opts.LogFile), fmt.Sprintf("ready %d\n", pid)) })
	}
	return opts
}

// start starts a process of opts and closes it when the test ends.
func start(t *testing.T, opts process.Options) *process.Process {
	t.Helper()
	p := process.New(opts)
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Logf("close: %v", err)
		}
	})
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, cond func() bool) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Error(err)
	}
	return string(data)
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// killedBy reports whether err is the exit error of a process that sig killed.
func killedBy(err error, sig syscall.Signal) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// exitCode returns the exit code in err, -1 if err is not an exit error.
func exitCode(err error) int {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return -1
	}
	return exit.ExitCode()
}

// alive reports whether pid is a process that has not exited: it is in /proc and no zombie.
func alive(t *testing.T, pid int) bool {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ...; comm may hold spaces and parentheses.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func TestBeforeStart(t *testing.T) {
	p := process.New(helper(t, "graceful"))
	if p.PID() != 0 || p.Exited() != nil || p.Running() || p.ExitErr() != nil {
		t.Errorf("before Start: PID %d, Exited %v, Running %v, ExitErr %v; want 0, nil, false, nil", p.PID(), p.Exited(), p.Running(), p.ExitErr())
	}
	if err := p.Kill(); !errors.Is(err, process.ErrNotStarted) {
		t.Errorf("Kill = %v, want ErrNotStarted", err)
	}
	if err := p.Stop(); !errors.Is(err, process.ErrNotStarted) {
		t.Errorf("Stop = %v, want ErrNotStarted", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close = %v, want nil", err)
	}
}

func TestKill(t *testing.T) {
	p := start(t, helper(t, "graceful"))
	pid, exited := p.PID(), p.Exited()
	if !p.Running() || !alive(t, pid) || closed(exited) || p.ExitErr() != nil {
		t.Fatalf("started process: Running %v, alive %v, exited %v, ExitErr %v", p.Running(), alive(t, pid), closed(exited), p.ExitErr())
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if !closed(exited) || p.Running() || alive(t, pid) {
		t.Errorf("after Kill: exited %v, Running %v, alive %v; want the process gone", closed(exited), p.Running(), alive(t, pid))
	}
	if err := p.ExitErr(); !killedBy(err, syscall.SIGKILL) {
		t.Errorf("ExitErr = %v, want killed by SIGKILL", err)
	}
	if strings.Contains(p.TailLog(1<<20), "terminated") {
		t.Error("the process saw SIGTERM; Kill must not give it a chance")
	}
	if err := p.Kill(); err != nil {
		t.Errorf("second Kill = %v, want nil", err)
	}
	if p.PID() != pid {
		t.Errorf("PID after the exit = %d, want %d", p.PID(), pid)
	}
}

func TestStop(t *testing.T) {
	p := start(t, helper(t, "graceful"))
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop of a process that exits 0 on SIGTERM = %v", err)
	}
	if p.Running() || p.ExitErr() != nil || !strings.HasSuffix(p.TailLog(1<<20), "terminated\n") {
		t.Errorf("after Stop: Running %v, ExitErr %v, log %q", p.Running(), p.ExitErr(), p.TailLog(1<<20))
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop = %v, want nil (the exit status of the stopped process)", err)
	}
}

// TestStopKillsAfterTimeout: a process that ignores SIGTERM is killed once StopTimeout has passed,
// and Stop says so. That SIGTERM comes first is what TestStop and TestProcessGroup show.
func TestStopKillsAfterTimeout(t *testing.T) {
	opts := helper(t, "ignore-term")
	opts.StopTimeout = 100 * time.Millisecond
	p := start(t, opts)
	err := p.Stop()
	if err == nil || !strings.Contains(err.Error(), "did not exit within 100ms of SIGTERM and was killed") {
		t.Errorf("Stop of a process that ignores SIGTERM = %v, want the timeout reported", err)
	}
	if p.Running() || !killedBy(p.ExitErr(), syscall.SIGKILL) {
		t.Errorf("after Stop: Running %v, ExitErr %v; want killed by SIGKILL", p.Running(), p.ExitErr())
	}
}

func TestExited(t *testing.T) {
	opts := helper(t, "exit")
	opts.Ready = nil
	p := start(t, opts)
	<-p.Exited()
	if p.Running() || exitCode(p.ExitErr()) != 3 {
		t.Errorf("after the exit: Running %v, ExitErr %v; want exit status 3", p.Running(), p.ExitErr())
	}
	if err := p.Stop(); exitCode(err) != 3 {
		t.Errorf("Stop of an exited process = %v, want its exit status 3", err)
	}
	if err := p.Kill(); err != nil {
		t.Errorf("Kill of an exited process = %v, want nil", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close of an exited process = %v, want nil", err)
	}
}

func TestStartFailsWhenTheProcessExits(t *testing.T) {
	opts := helper(t, "exit") // never prints "ready"
	p := process.New(opts)
	err := p.Start(t.Context())
	if exitCode(err) != 3 || !strings.Contains(err.Error(), "exited during start") || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("Start = %v, want the exit status 3 and the log", err)
	}
	if p.Running() {
		t.Error("Running after a failed Start")
	}
}

func TestStartKillsAProcessThatIsNotReady(t *testing.T) {
	opts := helper(t, "graceful")
	notReady := errors.New("not ready")
	opts.Ready = func(context.Context, int) error { return notReady }
	p := process.New(opts)
	if err := p.Start(t.Context()); !errors.Is(err, notReady) {
		t.Errorf("Start = %v, want the error of Ready", err)
	}
	if p.Running() || !killedBy(p.ExitErr(), syscall.SIGKILL) {
		t.Errorf("after the failed Start: Running %v, ExitErr %v; want killed by SIGKILL", p.Running(), p.ExitErr())
	}
}

func TestStartWhileRunningFails(t *testing.T) {
	p := start(t, helper(t, "graceful"))
	pid := p.PID()
	if err := p.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "still running") {
		t.Errorf("second Start = %v, want an error", err)
	}
	if p.PID() != pid || !p.Running() {
		t.Errorf("the second Start replaced the running process: PID %d, Running %v", p.PID(), p.Running())
	}
}

func TestRestart(t *testing.T) {
	p := start(t, helper(t, "graceful"))
	first, firstExited := p.PID(), p.Exited()

	// Readers meanwhile see one process or the other, never a mix (run with -race).
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for !closed(done) {
			_, _, _, _ = p.PID(), p.Running(), p.ExitErr(), p.Exited()
		}
	})
	err := p.Restart(t.Context())
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}

	second := p.PID()
	if second == first || !p.Running() || closed(p.Exited()) || !closed(firstExited) {
		t.Errorf("after Restart: PID %d (was %d), Running %v, exited %v, first exited %v", second, first, p.Running(), closed(p.Exited()), closed(firstExited))
	}
	log := p.TailLog(1 << 20)
	for _, want := range []string{"=== process: start 1 of graceful", "terminated", "=== process: start 2 of graceful", fmt.Sprintf("ready %d", second)} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

func TestEnvAndDir(t *testing.T) {
	opts := helper(t, "env")
	opts.Ready = nil
	opts.Dir = t.TempDir()
	opts.Env = append(opts.Env, "PROCESS_TEST_VALUE=seen")
	p := start(t, opts)
	<-p.Exited()
	if want := fmt.Sprintf("wd=%s err=<nil> value=seen\n", opts.Dir); !strings.HasSuffix(p.TailLog(1<<20), want) {
		t.Errorf("log = %q, want it to end in %q", p.TailLog(1<<20), want)
	}
}

func TestTailLog(t *testing.T) {
	opts := helper(t, "exit")
	opts.Ready = nil
	p := start(t, opts)
	<-p.Exited()
	whole := readFile(t, opts.LogFile)
	if !strings.HasPrefix(whole, "=== process: start 1 of exit: ") || !strings.HasSuffix(whole, "line 1\nline 2\nline 3\n") {
		t.Fatalf("log = %q, want a header and the output", whole)
	}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{n: 7, want: "line 3\n"},
		{n: 14, want: "line 2\nline 3\n"},
		{n: 0, want: ""},
		{n: len(whole), want: whole},
		{n: 1 << 20, want: whole},
	} {
		if got := p.TailLog(tc.n); got != tc.want {
			t.Errorf("TailLog(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if err := os.Remove(opts.LogFile); err != nil {
		t.Fatal(err)
	}
	if got := p.TailLog(10); !strings.HasPrefix(got, "(cannot read the log: ") {
		t.Errorf("TailLog of a missing log = %q, want a note", got)
	}
}

// TestProcessGroup: with ProcessGroup, Kill and Close leave nothing of the group behind, even
// a child that ignores SIGTERM.
func TestProcessGroup(t *testing.T) {
	// groupWithChild starts a group leader whose child ignores SIGTERM, and returns the child.
	groupWithChild := func(t *testing.T) (*process.Process, int) {
		opts := helper(t, "group")
		opts.ProcessGroup = true
		p := start(t, opts)
		_, after, _ := strings.Cut(p.TailLog(1<<20), "child ")
		child, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(after, "\n", 2)[0]))
		if err != nil {
			t.Fatalf("no child in the log (%v):\n%s", err, p.TailLog(1<<20))
		}
		// Ready to ignore SIGTERM.
		if err := waitFor(t.Context(), func() bool { return strings.Contains(p.TailLog(1<<20), fmt.Sprintf("ready %d\n", child)) }); err != nil {
			t.Fatalf("child %d not ready: %v", child, err)
		}
		return p, child
	}
	// gone waits until pid has exited; the test binary is not its parent and cannot wait for it.
	gone := func(t *testing.T, pid int) bool {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		return waitFor(ctx, func() bool { return !alive(t, pid) }) == nil
	}

	t.Run("Kill", func(t *testing.T) {
		p, child := groupWithChild(t)
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		if !gone(t, child) {
			t.Errorf("child %d of the group lives on after Kill", child)
		}
	})
	t.Run("StopThenClose", func(t *testing.T) {
		p, child := groupWithChild(t)
		if err := p.Stop(); err != nil {
			t.Fatalf("Stop of a leader that exits 0 on SIGTERM = %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := waitFor(ctx, func() bool { return strings.Contains(p.TailLog(1<<20), "ignored SIGTERM") }); err != nil {
			t.Errorf("SIGTERM did not reach the group's child (%v):\n%s", err, p.TailLog(1<<20))
		}
		if !alive(t, child) {
			t.Fatalf("child %d that ignores SIGTERM died on Stop", child)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if !gone(t, child) {
			t.Errorf("child %d of the group lives on after Close", child)
		}
	})
}
