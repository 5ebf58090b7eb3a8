package check

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// driverProc is the node plugin the check runs from --driver-command.
type driverProc struct {
	command, socket, logFile string
	cmd                      *exec.Cmd
	exited                   chan struct{}
	// exit is how this start's process exited, set before exited is
	// closed; each start has its own.
	exit *procExit
	// ended says the check itself ended the driver (kill, stop): its exit
	// is not a crash.
	ended bool
}

// procExit is cmd.Wait's error.
type procExit struct{ err error }

func startDriver(ctx context.Context, command, endpoint, logFile string) (*driverProc, error) {
	socket, err := csiclient.ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	p := &driverProc{command: command, socket: socket, logFile: logFile}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *driverProc) start(ctx context.Context) error {
	log, err := os.OpenFile(p.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	// Not bound to ctx: the driver is stopped by stop, after the cleanup.
	cmd := exec.Command("/bin/sh", "-c", p.command) //nolint:gosec // the user's own command
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A driver the check cannot start again is the driver's failure, not
	// an end the check chose.
	p.ended = false
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the driver: %w", err)
	}
	exit, exited := &procExit{}, make(chan struct{})
	p.cmd, p.exited, p.exit = cmd, exited, exit
	go func() {
		exit.err = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("unix", p.socket, time.Second); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("the driver exited (%s) before it served %s; its last output: %s", exitDescription(exit.err), p.socket, lastLines(p.logFile, crashOutputLines))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the driver does not serve %s after 30s", p.socket)
		}
	}
}

// goneTimeout bounds the wait for a killed driver's processes and socket.
const goneTimeout = 30 * time.Second

// kill ends the driver with SIGKILL (its whole process group), as a
// crash does, and returns once it is gone as a container runtime sees a
// container gone: every process of the group exited, not only the first
// one (a driver command that wraps the driver — a shell, unshare, a
// runtime's shim — sees its wrapper exit first, while the driver and its
// children, a FUSE driver's daemons, are still dying), and nothing
// answers on its socket any more. Until then the old driver may still
// accept a connection, and its mounts may still work.
func (p *driverProc) kill() error {
	p.ended = true
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
	deadline := time.Now().Add(goneTimeout)
	for {
		left := groupMembers(p.cmd.Process.Pid)
		served := false
		if c, err := net.DialTimeout("unix", p.socket, time.Second); err == nil {
			_ = c.Close()
			served = true
		}
		if len(left) == 0 && !served {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s after SIGKILL: processes of its group still running %v, its socket still served: %v", goneTimeout, left, served)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// groupMembers returns the processes of process group pgid that have not
// exited (zombies, which only wait to be reaped, aside).
func groupMembers(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// stop ends the driver with SIGTERM, SIGKILL after 10s.
func (p *driverProc) stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	p.ended = true
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		if err := p.kill(); err != nil {
			return fmt.Errorf("the driver did not exit within 10s of SIGTERM, nor %w", err)
		}
		return errors.New("the driver did not exit within 10s of SIGTERM; killed it")
	}
}

// crashed returns, when the driver exited without the check ending it (a
// driver that panics, or that someone else killed) or no longer serves its
// socket though a process of its command still runs (a wrapper around a
// driver that died), what happened and the driver's last lines of output;
// nil while it serves, or after the check ended it.
func (p *driverProc) crashed() error {
	if p.ended {
		return nil
	}
	select {
	case <-p.exited:
	default:
		if serving(p.socket) {
			return nil
		}
		// A call may have seen the driver's connection drop before its
		// process was reaped: a driver that no longer serves its socket
		// gets a moment to be seen exiting.
		select {
		case <-p.exited:
		case <-time.After(exitGrace):
			return fmt.Errorf("the driver no longer answers on %s, though its command still runs; its last output: %s",
				p.socket, lastLines(p.logFile, crashOutputLines))
		}
	}
	return fmt.Errorf("the driver exited on its own (%s); its last output: %s", exitDescription(p.exit.err), lastLines(p.logFile, crashOutputLines))
}

// exitDescription says how a process exited, from cmd.Wait's error.
func exitDescription(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// serving says whether a gRPC server answers on the socket: a dying
// process's socket may still accept a connection, but only a live server
// answers the HTTP/2 client preface with its settings frame.
func serving(socket string) bool {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return false
	}
	defer func() { _ = c.Close() }()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return false
	}
	if _, err := io.WriteString(c, http2ClientPreface); err != nil {
		return false
	}
	_, err = c.Read(make([]byte, 1))
	return err == nil
}

// http2ClientPreface opens an HTTP/2 connection (RFC 9113, section 3.4).
const http2ClientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// exitGrace is how long a driver that refuses connections is given to be
// seen exiting.
const exitGrace = 5 * time.Second

// crashOutputLines is how much of a crashed driver's output a result
// quotes: a panic's message and the top of its stack.
const crashOutputLines = 12

// lastLines returns the last n lines of the file (read from its last
// 64 KiB), or why it cannot.
func lastLines(path string, n int) string {
	f, err := os.Open(path) //nolint:gosec // the check's own log file
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	const tail = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > tail {
		if _, err := f.Seek(-tail, io.SeekEnd); err != nil {
			return err.Error()
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	text := strings.TrimRight(string(b), "\n")
	if text == "" {
		return "(none)"
	}
	lines := strings.Split(text, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
