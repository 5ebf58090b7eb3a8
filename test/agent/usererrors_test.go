package agent_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// TestUserErrors: the mistakes a user makes when starting the agent end it
// at once with a non-zero exit code and one line that names the flag.
func TestUserErrors(t *testing.T) {
	t.Parallel()
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeConfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeConfig, k8stest.Shared(t).KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	readOnly := filepath.Join(dir, "ro")
	if err := os.Mkdir(readOnly, 0o750); err != nil {
		t.Fatal(err)
	}
	mounter := mount.New("")
	if err := mounter.Mount("tmpfs", readOnly, "tmpfs", []string{"ro", "size=1m"}); err != nil {
		t.Fatalf("mount a read-only file system: %v", err)
	}
	t.Cleanup(func() { _ = mounter.Unmount(readOnly) })
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Close() })

	tests := map[string]struct {
		args []string
		want string
	}{
		"kubeconfig missing": {
			args: []string{"--kubeconfig", filepath.Join(dir, "missing"), "--root-dir", filepath.Join(dir, "root1")},
			want: "--kubeconfig " + filepath.Join(dir, "missing"),
		},
		"root dir on a read-only file system": {
			args: []string{"--kubeconfig", kubeConfig, "--root-dir", filepath.Join(readOnly, "root")},
			want: "--root-dir " + filepath.Join(readOnly, "root"),
		},
		"port in use": {
			args: []string{"--kubeconfig", kubeConfig, "--root-dir", filepath.Join(dir, "root2"), "--http-endpoint", busy.Addr().String()},
			want: "--http-endpoint " + busy.Addr().String(),
		},
		"relative root dir": {
			args: []string{"--kubeconfig", kubeConfig, "--root-dir", "relative"},
			want: "--root-dir \"relative\" must be an absolute path",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var out bytes.Buffer
			cmd := exec.CommandContext(ctx, bin, append([]string{"run", "--node-name", "n", "--http-endpoint", "127.0.0.1:0"}, tc.args...)...)
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitCode() <= 0 {
				t.Fatalf("exit: %v, want a non-zero exit code; output:\n%s", err, out.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Errorf("output %q, want one line that contains %q", out.String(), tc.want)
			}
		})
	}
}
