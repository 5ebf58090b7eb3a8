package check

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// TestKillWaitsForTheWholeDriver: kill returns only once no process of the
// driver command's group is left and nothing answers on its socket — not
// when the command's first process (a wrapper around the driver) exited:
// until then the old driver may still accept a connection, which a restart
// would take for the new driver's.
func TestKillWaitsForTheWholeDriver(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "csi.sock")
	// The "driver" is a wrapper and a child of it in one process group; the
	// socket is served by the test, which stands for a driver process that
	// still answers after the wrapper died.
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	p := &driverProc{command: "sleep 100 & exec sleep 100", socket: socket, logFile: filepath.Join(dir, "driver.log")}
	cmd, exited := startGroup(t, p)
	if members := groupMembers(cmd); len(members) != 2 {
		t.Fatalf("process group %d has %v, want the wrapper and its child", cmd, members)
	}

	released := 300 * time.Millisecond
	time.AfterFunc(released, func() { _ = lis.Close() })
	start := time.Now()
	if err := p.kill(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < released {
		t.Errorf("kill returned after %s, while the socket still answered for %s", took, released)
	}
	<-exited
	if members := groupMembers(cmd); len(members) != 0 {
		t.Errorf("after kill, the group still has %v", members)
	}
	if _, err := os.Stat(p.logFile); err != nil {
		t.Error(err)
	}
}

// startGroup starts p's command without waiting for a socket (the test
// serves it) and returns its process group.
func startGroup(t *testing.T, p *driverProc) (int, chan struct{}) {
	t.Helper()
	// start waits until the socket answers, which the test's listener does.
	if err := p.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(groupMembers(p.cmd.Process.Pid)) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() { _ = p.stop() })
	return p.cmd.Process.Pid, p.exited
}

// TestGroupMembersSkipsZombies: a process that exited but is not reaped yet
// is no longer a member that kill waits for.
func TestGroupMembersSkipsZombies(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "exit 0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err == nil && strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d did not become a zombie: %s", pid, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if members := groupMembers(pid); len(members) != 0 {
		t.Errorf("groupMembers(%d) = %v for a group whose only process is a zombie", pid, members)
	}
}

// TestServingTellsALiveGRPCServerFromADyingSocket: a gRPC server answers
// the probe; a socket that accepts connections but whose process no
// longer serves them (a dying driver) and a socket nobody listens on do
// not.
func TestServingTellsALiveGRPCServerFromADyingSocket(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	if !serving(live) {
		t.Error("a live gRPC server is not taken for serving")
	}

	mute := filepath.Join(dir, "mute.sock")
	ml, err := net.Listen("unix", mute)
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Close()
	if serving(mute) {
		t.Error("a socket that accepts but never answers is taken for serving")
	}
	// A server that answers only once the client spoke first, as an
	// HTTP/2 server may, is live too.
	polite := filepath.Join(dir, "polite.sock")
	pl, err := net.Listen("unix", polite)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	go func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				preface := make([]byte, len(http2ClientPreface))
				if _, err := io.ReadFull(c, preface); err == nil && string(preface) == http2ClientPreface {
					_, _ = c.Write([]byte{0})
				}
			}()
		}
	}()
	if !serving(polite) {
		t.Error("a server that answers after the client preface is not taken for serving")
	}
	if serving(filepath.Join(dir, "none.sock")) {
		t.Error("a socket nobody listens on is taken for serving")
	}
}
