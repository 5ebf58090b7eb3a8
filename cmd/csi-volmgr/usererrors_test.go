package main_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
)

// runAgent runs the built csi-volmgr with args and returns its exit code
// and stderr. The agent must exit on its own: every case is a mistake it
// must refuse at start.
func runAgent(t *testing.T, args ...string) (int, string) {
	t.Helper()
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("csi-volmgr %v did not exit; stderr:\n%s", args, stderr.String())
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, stderr.String()
}

// wantOneLine checks that the agent failed with exit code 1 and exactly one
// line on stderr that says every part of want.
func wantOneLine(t *testing.T, code int, stderr string, want ...string) {
	t.Helper()
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("stderr has %d lines, want one:\n%s", len(lines), stderr)
	}
	if !strings.HasPrefix(lines[0], "csi-volmgr: ") {
		t.Errorf("stderr %q does not start with %q", lines[0], "csi-volmgr: ")
	}
	for _, w := range want {
		if !strings.Contains(lines[0], w) {
			t.Errorf("stderr %q does not say %q", lines[0], w)
		}
	}
}

// baseArgs are valid arguments of a standalone agent under dir.
func baseArgs(t *testing.T, dir string) []string {
	manifests := filepath.Join(dir, "manifests")
	if err := os.MkdirAll(manifests, 0o750); err != nil {
		t.Fatal(err)
	}
	return []string{"run", "--node-name=n1", "--manifests=" + manifests, "--http-endpoint="}
}

func TestUnreadableKubeconfig(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing-kubeconfig")
	code, stderr := runAgent(t, "run", "--node-name=n1", "--root-dir="+filepath.Join(dir, "root"), "--kubeconfig="+missing)
	wantOneLine(t, code, stderr, "--kubeconfig "+missing, "no such file or directory")

	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("clusters: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stderr = runAgent(t, "run", "--node-name=n1", "--root-dir="+filepath.Join(dir, "root"), "--kubeconfig="+garbage)
	wantOneLine(t, code, stderr, "--kubeconfig "+garbage, "error loading config file")
}

func TestRootDirOnAReadOnlyFileSystem(t *testing.T) {
	dir := t.TempDir()
	// A read-only tmpfs: the root directory cannot even be created.
	ro := filepath.Join(dir, "ro")
	mountRO(t, ro, func() error { return syscall.Mount("tmpfs", ro, "tmpfs", syscall.MS_RDONLY, "") })
	code, stderr := runAgent(t, append(baseArgs(t, dir), "--root-dir="+filepath.Join(ro, "root"))...)
	wantOneLine(t, code, stderr, "--root-dir "+filepath.Join(ro, "root"), "read-only file system")

	// A read-only bind mount of an existing directory: it exists, but
	// nothing can be written in it.
	existing := filepath.Join(dir, "existing")
	if err := os.MkdirAll(existing, 0o750); err != nil {
		t.Fatal(err)
	}
	bound := filepath.Join(dir, "bound")
	mountRO(t, bound, func() error {
		if err := syscall.Mount(existing, bound, "", syscall.MS_BIND, ""); err != nil {
			return err
		}
		return syscall.Mount("", bound, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, "")
	})
	code, stderr = runAgent(t, append(baseArgs(t, dir), "--root-dir="+bound)...)
	wantOneLine(t, code, stderr, "--root-dir "+bound+" is not writable", "read-only file system")
}

// mountRO creates dir, mounts it with mount and unmounts it at the end.
func mountRO(t *testing.T, dir string, mount func() error) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := mount(); err != nil {
		t.Fatalf("mounting %s read-only: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

func TestManifestThatDoesNotParse(t *testing.T) {
	dir := t.TempDir()
	args := baseArgs(t, dir)
	bad := filepath.Join(dir, "manifests", "pod.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stderr := runAgent(t, append(args, "--root-dir="+filepath.Join(dir, "root"))...)
	wantOneLine(t, code, stderr, bad+":5: not valid YAML")
}

func TestPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := t.TempDir()
	args := append(baseArgs(t, dir), "--root-dir="+filepath.Join(dir, "root"), "--http-endpoint="+l.Addr().String())
	code, stderr := runAgent(t, args...)
	wantOneLine(t, code, stderr, "--http-endpoint "+l.Addr().String(), "address already in use")
}

func TestManifestsWithAnAPIServerFlag(t *testing.T) {
	dir := t.TempDir()
	args := append(baseArgs(t, dir), "--root-dir="+filepath.Join(dir, "root"), "--register-node")
	code, stderr := runAgent(t, args...)
	wantOneLine(t, code, stderr, "--manifests runs without an API server: --register-node cannot be used with it")
}

// TestPlaintextOffLoopback: plain HTTP on an address other hosts reach is
// refused at start, in one line naming the flag; on the loopback it runs.
func TestPlaintextOffLoopback(t *testing.T) {
	dir := t.TempDir()
	args := append(baseArgs(t, dir), "--root-dir="+filepath.Join(dir, "root"), "--http-endpoint=:0", "--http-endpoint-plaintext")
	code, stderr := runAgent(t, args...)
	wantOneLine(t, code, stderr, `--http-endpoint-plaintext is only allowed on a loopback endpoint (127.0.0.1, ::1 or localhost), and ":0" is reachable from other hosts`)
}

// TestTLSBelow12: --tls-min-version below 1.2 is refused, naming the flag.
func TestTLSBelow12(t *testing.T) {
	dir := t.TempDir()
	args := append(baseArgs(t, dir), "--root-dir="+filepath.Join(dir, "root"), "--http-endpoint=127.0.0.1:0", "--tls-min-version=VersionTLS11")
	code, stderr := runAgent(t, args...)
	wantOneLine(t, code, stderr, "--tls-min-version TLS 1.1 is below TLS 1.2")
}
