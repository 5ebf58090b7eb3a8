package deploy_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

const (
	// agentStopTimeout bounds the wait for the agent to exit after SIGTERM.
	agentStopTimeout = 45 * time.Second
	// agentLogTail is how much of the agent's log a failed test prints.
	agentLogTail = 24 << 10
	// raceExitCode is the exit code of a process whose race detector fired.
	raceExitCode = 66
)

// agentConfig is one agent process.
type agentConfig struct {
	// Container is the agent container of the rendered DaemonSet: its args
	// are the command line, with $(NODE_NAME) resolved to Host and the
	// host-specific directories replaced.
	Container *corev1.Container
	// Env is the API server.
	Env *k8stest.Env
	// Host is the node the DaemonSet's pod runs on, spec.nodeName.
	Host string
	// BootstrapToken is the token of the agent's ServiceAccount bound to
	// its pod on Host: what the DaemonSet's pod mounts, written into the
	// kubeconfig the agent is given (--kubeconfig replaces the in-cluster
	// configuration, nothing else).
	BootstrapToken string
	// NodeCertificate, when set, is the Node's client certificate and key
	// (PEM), written into <root>/pki as the current one before the agent
	// starts, as an earlier start of the agent would have left it: the agent
	// then acts as its Node at once. Without it the agent asks for one.
	NodeCertificate []byte
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
	*process.Process
	Root, RegistrationDir string
	// NodeName is its --node-name, resolved.
	NodeName string
	// HTTPEndpoint is its --http-endpoint, a free loopback port.
	HTTPEndpoint string
}

// certPairFile is where the agent keeps its current Node certificate and
// key, below <root-dir>/pki, the default --cert-dir (client-go's
// certificate.FileStore with the prefix csi-volmgr-client).
const certPairFile = "csi-volmgr-client-current.pem"

// daemonSetArgs returns the container's args with the flags in overrides
// replaced and the variables the kubelet expands resolved: $(NODE_NAME)
// from spec.nodeName is host. Every override must replace a flag the
// DaemonSet sets, so that the test notices when the manifests change shape;
// kubeconfig is appended.
func daemonSetArgs(c *corev1.Container, host string, overrides map[string]string, kubeconfig string) ([]string, error) {
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
	for _, e := range c.Env {
		value := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			value = host
		default:
			continue
		}
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], "$("+e.Name+")", value)
		}
	}
	for _, a := range args {
		if strings.Contains(a, "$(") {
			return nil, fmt.Errorf("arg %q refers to an environment variable the test does not resolve", a)
		}
	}
	return append(args, "--kubeconfig="+kubeconfig), nil
}

// writeTokenKubeconfig writes a kubeconfig for env's API server (its
// address and CA) that authenticates with token only, as the in-cluster
// configuration of a pod does.
func writeTokenKubeconfig(env *k8stest.Env, token, path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["cluster"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["context"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "user"}
	cfg.CurrentContext = "context"
	return clientcmd.WriteToFile(*cfg, path)
}

// nodeCertificate issues a client certificate of the Node name with the
// API server's node signer, as kube-controller-manager signs an approved
// request, and returns certificate and key in one PEM file's content.
func nodeCertificate(tb testing.TB, env *k8stest.Env, name string) []byte {
	tb.Helper()
	certPEM, keyPEM, err := env.Signer.ClientCert("system:node:"+name, 24*time.Hour, "system:nodes")
	if err != nil {
		tb.Fatal(err)
	}
	return append(certPEM, keyPEM...)
}

// startAgent runs the agent until the test ends. Cleanups stop it first
// (SIGTERM), then whatever the caller registered before (plugins), then
// remove Dir. A race report fails the test; other exit codes are for the
// caller to judge (ExitErr).
func startAgent(t *testing.T, cfg agentConfig) *agentProcess {
	t.Helper()
	a := &agentProcess{
		Root:            filepath.Join(cfg.Dir, "root"),
		RegistrationDir: filepath.Join(cfg.Dir, "reg"),
	}
	kubeconfig := filepath.Join(cfg.Dir, "kubeconfig")
	if err := writeTokenKubeconfig(cfg.Env, cfg.BootstrapToken, kubeconfig); err != nil {
		t.Fatal(err)
	}
	if cfg.NodeCertificate != nil {
		pki := filepath.Join(a.Root, "pki")
		if err := os.MkdirAll(pki, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pki, certPairFile), cfg.NodeCertificate, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Many agents run at once: a free loopback port each.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.HTTPEndpoint = l.Addr().String()
	_ = l.Close()
	args, err := daemonSetArgs(cfg.Container, cfg.Host, map[string]string{
		"root-dir":         a.Root,
		"registration-dir": a.RegistrationDir,
	}, kubeconfig)
	if err != nil {
		t.Fatalf("agent command line from the DaemonSet: %v", err)
	}
	a.NodeName, _ = flagValue(args, "node-name")
	// The DaemonSet keeps the default 127.0.0.1:9809 (TestAgentDaemonSet);
	// agents that run at once need a port each.
	args = append(args, "--http-endpoint="+a.HTTPEndpoint)
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(cfg.Dir, "agent.log")
	a.Process = process.New(process.Options{
		Name:        "agent",
		Path:        bin,
		Args:        args,
		Env:         append(os.Environ(), fmt.Sprintf("KUBE_FEATURE_WatchListClient=%t", cfg.WatchList)),
		LogFile:     logFile,
		StopTimeout: agentStopTimeout,
	})
	if err := a.Start(t.Context()); err != nil {
		t.Fatalf("starting the agent: %v", err)
	}
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			var exit *exec.ExitError
			switch {
			case !errors.As(err, &exit):
				t.Error(err) // not stopped by SIGTERM
			case exit.ExitCode() == raceExitCode:
				t.Errorf("the agent's race detector fired: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("agent command line: %q\nagent log (%s), last %d bytes:\n%s", args, logFile, agentLogTail, a.TailLog(agentLogTail))
		}
	})
	return a
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
		mounts, err := agenttest.MountsBelow(dir)
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
