package check

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// driverProc is the node plugin the check runs from --driver-command.
type driverProc struct {
	command, socket, logFile string
	cmd                      *exec.Cmd
	exited                   chan struct{}
}

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
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the driver: %w", err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(p.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("unix", p.socket, time.Second); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("the driver exited before it served %s (its output: %s)", p.socket, p.logFile)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the driver does not serve %s after 30s", p.socket)
		}
	}
}

// kill ends the driver with SIGKILL (its whole process group), as a
// crash does.
func (p *driverProc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// stop ends the driver with SIGTERM, SIGKILL after 10s.
func (p *driverProc) stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		p.kill()
		return errors.New("the driver did not exit within 10s of SIGTERM; killed it")
	}
}
