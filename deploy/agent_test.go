package deploy_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/mount-utils"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	// agentStopTimeout bounds the wait for the agent to exit after SIGTERM.
	agentStopTimeout = 45 * time.Second
	// agentLogTail is how much of the agent's log a failed test prints.
	agentLogTail = 24 << 10
	// raceExitCode is the exit code of a process whose race detector fired.
	raceExitCode = 66
)

// The agent binary, built once per test binary (with -race when the test
// binary has it) and removed by TestMain.
var agentBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// agentBinary builds ./cmd/csi-volmgr on first use and returns its path.
func agentBinary(tb testing.TB) string {
	tb.Helper()
	agentBuild.once.Do(func() {
		if agentBuild.dir, agentBuild.err = os.MkdirTemp("", "deploy-agent"); agentBuild.err != nil {
			return
		}
		agentBuild.path = filepath.Join(agentBuild.dir, "csi-volmgr")
		args := []string{"build", "-o", agentBuild.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/csi-volmgr")...)
		cmd.Dir = repoRoot(tb)
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBuild.err = fmt.Errorf("go build ./cmd/csi-volmgr: %w\n%s", err, out)
		}
	})
	if agentBuild.err != nil {
		tb.Fatal(agentBuild.err)
	}
	return agentBuild.path
}

// agentConfig is one agent process.
type agentConfig struct {
	// Container is the agent container of the rendered DaemonSet: its args
	// are the command line, with the host-specific flags replaced.
	Container *corev1.Container
	// Env is the API server; the agent talks to it as User.
	Env *k8stest.Env
	// ServiceAccount is the identity the agent impersonates, as a pod
	// running with that ServiceAccount would be.
	ServiceAccount corev1.ObjectReference
	// NodeName replaces --node-name.
	NodeName string
	// Dir holds root/, reg/, the kubeconfig and the log. Keep it short:
	// registration socket paths must fit a unix socket address.
	Dir string
	// WatchList is the client-go WatchListClient feature gate of the agent
	// (KUBE_FEATURE_WatchListClient); false makes every informer LIST and
	// then WATCH, as against an API server that does not serve watch-list.
	WatchList bool
}

// agentProcess is `csi-volmgr run` as a process.
type agentProcess struct {
	Root, RegistrationDir, LogFile string
	Args                           []string

	cmd    *exec.Cmd
	exited chan struct{}
	// waitErr is written before exited is closed.
	waitErr error
}

// daemonSetArgs returns the container's args with the flags in overrides
// replaced. Every override must replace a flag the DaemonSet sets, so that
// the test notices when the manifests change shape; kubeconfig is appended.
func daemonSetArgs(c *corev1.Container, overrides map[string]string, kubeconfig string) ([]string, error) {
	if len(c.Args) == 0 || c.Args[0] != "run" {
		return nil, fmt.Errorf("container %s: args %q do not start with run", c.Name, c.Args)
	}
	if len(c.Command) > 0 {
		return nil, fmt.Errorf("container %s: a command %q overrides the image's entrypoint", c.Name, c.Command)
	}
	args := slices.Clone(c.Args)
	seen := map[string]bool{}
	for i, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if v, ok := overrides[name]; ok && strings.HasPrefix(a, "--") {
			args[i] = "--" + name + "=" + v
			seen[name] = true
		}
		if name == "kubeconfig" {
			return nil, errors.New("the DaemonSet sets --kubeconfig; it must use the in-cluster configuration")
		}
	}
	for name := range overrides {
		if !seen[name] {
			return nil, fmt.Errorf("the DaemonSet does not set --%s", name)
		}
	}
	for _, a := range args {
		if strings.Contains(a, "$(") {
			return nil, fmt.Errorf("arg %q refers to an environment variable the test does not resolve", a)
		}
	}
	return append(args, "--kubeconfig="+kubeconfig), nil
}

// writeImpersonatingKubeconfig writes the admin kubeconfig of env, changed to
// impersonate sa with the groups the API server gives a ServiceAccount.
func writeImpersonatingKubeconfig(env *k8stest.Env, sa corev1.ObjectReference, path string) error {
	cfg, err := clientcmd.Load(env.KubeConfig)
	if err != nil {
		return fmt.Errorf("parsing the test kubeconfig: %w", err)
	}
	imp := env.ImpersonateServiceAccount(sa.Namespace, sa.Name).Impersonate
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = imp.UserName
		ai.ImpersonateGroups = imp.Groups
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// startAgent runs the agent until the test ends. Cleanups stop it first
// (SIGTERM), then whatever the caller registered before (plugins), then
// remove Dir.
func startAgent(t *testing.T, cfg agentConfig) *agentProcess {
	t.Helper()
	a := &agentProcess{
		Root:            filepath.Join(cfg.Dir, "root"),
		RegistrationDir: filepath.Join(cfg.Dir, "reg"),
		LogFile:         filepath.Join(cfg.Dir, "agent.log"),
		exited:          make(chan struct{}),
	}
	kubeconfig := filepath.Join(cfg.Dir, "kubeconfig")
	if err := writeImpersonatingKubeconfig(cfg.Env, cfg.ServiceAccount, kubeconfig); err != nil {
		t.Fatal(err)
	}
	args, err := daemonSetArgs(cfg.Container, map[string]string{
		"node-name":        cfg.NodeName,
		"root-dir":         a.Root,
		"registration-dir": a.RegistrationDir,
		// Many agents run at once: a free loopback port each.
		"http-endpoint": "127.0.0.1:0",
	}, kubeconfig)
	if err != nil {
		t.Fatalf("agent command line from the DaemonSet: %v", err)
	}
	a.Args = args
	log, err := os.Create(a.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	a.cmd = exec.Command(agentBinary(t), args...)
	a.cmd.Stdout, a.cmd.Stderr = log, log
	a.cmd.Env = append(os.Environ(), fmt.Sprintf("KUBE_FEATURE_WatchListClient=%t", cfg.WatchList))
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("starting the agent: %v", err)
	}
	go func() {
		a.waitErr = a.cmd.Wait()
		close(a.exited)
	}()
	t.Cleanup(func() {
		if err := a.stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("agent command line: %q\nagent log (%s), last %d bytes:\n%s", a.Args, a.LogFile, agentLogTail, a.tailLog())
		}
	})
	return a
}

// stop sends SIGTERM and waits for the exit. A race report is an error;
// other exit codes are for the caller to judge (ExitCode).
func (a *agentProcess) stop() error {
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling the agent: %w", err)
	}
	timer := time.NewTimer(agentStopTimeout)
	defer timer.Stop()
	select {
	case <-a.exited:
	case <-timer.C:
		_ = a.cmd.Process.Kill()
		<-a.exited
		return fmt.Errorf("the agent did not exit within %v of SIGTERM", agentStopTimeout)
	}
	if code := a.cmd.ProcessState.ExitCode(); code == raceExitCode {
		return fmt.Errorf("the agent's race detector fired (exit code %d)", code)
	}
	return nil
}

// Exited is closed when the process has exited.
func (a *agentProcess) Exited() <-chan struct{} { return a.exited }

// ExitErr is the process's exit error once it has exited.
func (a *agentProcess) ExitErr() error {
	<-a.exited
	return a.waitErr
}

func (a *agentProcess) tailLog() string {
	data, err := os.ReadFile(a.LogFile)
	if err != nil {
		return fmt.Sprintf("(cannot read the log: %v)", err)
	}
	if len(data) > agentLogTail {
		data = data[len(data)-agentLogTail:]
	}
	return string(data)
}

// agentDir makes a short directory for one agent and its plugin, removed
// when the test ends after everything registered later. It refuses to
// remove a tree that still has mounts in it.
func agentDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mounts, err := mountsBelow(dir)
		if err != nil {
			t.Errorf("reading the mount table: %v", err)
			return
		}
		if len(mounts) > 0 {
			t.Errorf("mounts left below %s: %v (directory kept)", dir, mounts)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("removing %s: %v", dir, err)
		}
	})
	return dir
}

// mountsBelow lists the mount points below dir.
func mountsBelow(dir string) ([]string, error) {
	mps, err := mount.New("").List()
	if err != nil {
		return nil, fmt.Errorf("listing mounts: %w", err)
	}
	var out []string
	for _, mp := range mps {
		if strings.HasPrefix(mp.Path, dir+"/") {
			out = append(out, mp.Path)
		}
	}
	return out, nil
}
