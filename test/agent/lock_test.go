package agent_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestSecondAgentOnOneRootRefusesToStart: while an agent runs over a root
// directory, a second `csi-volmgr run` over the same root exits non-zero at
// once, naming the lock file, and leaves the first one serving: two volume
// managers over one root would each tear down what the other set up.
func TestSecondAgentOnOneRootRefusesToStart(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)

	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cmd := exec.CommandContext(ctx, bin, "run",
		"--kubeconfig="+n.agent.KubeconfigPath,
		"--node-name="+n.f.NodeName,
		"--root-dir="+n.agent.RootDir,
		"--registration-dir="+n.agent.RegistrationDir,
		"--http-endpoint=127.0.0.1:0",
	)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	exitErr, ok := errors.AsType[*exec.ExitError](err)
	if !ok || exitErr.ExitCode() == 0 {
		t.Fatalf("second agent on %s: err %v, want a non-zero exit; output:\n%s", n.agent.RootDir, err, out)
	}
	lock := volumemanager.LockFile(n.agent.RootDir)
	if !strings.Contains(string(out), lock) || !strings.Contains(string(out), "in use by another csi-volmgr") {
		t.Errorf("second agent's output does not name the lock %s and why:\n%s", lock, out)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("second agent took %v to give up, want at once", took)
	}
	// The first agent still serves.
	if code, _, err := n.agent.Get(ctx, agenttest.HealthzPath); err != nil || code != 200 {
		t.Errorf("first agent after the second one exited: /healthz %d, %v", code, err)
	}
}
