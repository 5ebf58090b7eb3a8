package drivertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

// crdGVR is CustomResourceDefinitions'.
var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Timeout bounds the waits of the helpers.
const Timeout = 2 * time.Minute

// RepoRoot is the repository's root: the first directory up from the test's working directory
// with the project's go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/csi-volmgr/csi-volmgr\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("the repository's root (go.mod of github.com/csi-volmgr/csi-volmgr) is not above the working directory")
		}
		dir = parent
	}
}

// Binary is bin/drivers/<driver>/<name>, which make drivers-bins-<driver> builds.
func Binary(t testing.TB, driver, name string) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), "bin", "drivers", driver, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%v: run make drivers-bins-%s", err, driver)
	}
	return p
}

// K8sBin is a binary of make e2e-bins (kube-controller-manager), in $KUBEBUILDER_ASSETS or bin/k8s.
func K8sBin(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "bin", "k8s")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%v: run make e2e-bins", err)
	}
	return p
}

// ModuleDir is module's directory in the module cache, as the build-only module in toolsDir (a
// path from the repository's root) resolves it: a driver's manifests (CRDs, CSIDriver, RBAC) are
// applied from there, never retyped.
func ModuleDir(t testing.TB, toolsDir, module string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = filepath.Join(RepoRoot(t), toolsDir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m %s in %s: %v", module, toolsDir, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatalf("the module %s is not in the module cache: build the driver's binaries first", module)
	}
	return dir
}

// Applier creates manifests' objects of any kind through the dynamic client.
type Applier struct {
	// Dyn is the dynamic client it creates with.
	Dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier is an Applier acting with cfg.
func NewApplier(t testing.TB, cfg *rest.Config) *Applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &Applier{Dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// Create creates u, finding its resource by discovery (asked again once, for a CRD just
// established).
func (a *Applier) Create(ctx context.Context, u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		a.mapper.Reset()
		if m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return fmt.Errorf("%s: %w", gvk, err)
		}
	}
	var ri dynamic.ResourceInterface = a.Dyn.Resource(m.Resource)
	if u.GetNamespace() != "" {
		ri = a.Dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	if _, err := ri.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// ApplyFile creates every object of the YAML file path that keep accepts (nil: all).
func (a *Applier) ApplyFile(ctx context.Context, path string, keep func(*unstructured.Unstructured) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	objs, err := k8stest.DecodeManifests(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, u := range objs {
		if keep != nil && !keep(u) {
			continue
		}
		if err := a.Create(ctx, u); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// WaitEstablished waits until the CRD name is Established.
func (a *Applier) WaitEstablished(ctx context.Context, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, Timeout, true, func(ctx context.Context) (bool, error) {
		crd, err := a.Dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
}

// TokenKubeconfig is a kubeconfig for base's server and CA with a bearer token, as the
// ServiceAccount's in-cluster configuration of a DaemonSet pod.
func TokenKubeconfig(t testing.TB, base *rest.Config, token string) []byte {
	t.Helper()
	return kubeconfig(t, base, &clientcmdapi.AuthInfo{Token: token})
}

// CertKubeconfig is a kubeconfig for base's server and CA with cfg's client certificate.
func CertKubeconfig(t testing.TB, base, cfg *rest.Config) []byte {
	t.Helper()
	return kubeconfig(t, base, &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData})
}

func kubeconfig(t testing.TB, base *rest.Config, auth *clientcmdapi.AuthInfo) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["drivers"] = &clientcmdapi.Cluster{Server: base.Host, CertificateAuthorityData: base.CAData}
	cfg.AuthInfos["drivers"] = auth
	cfg.Contexts["drivers"] = &clientcmdapi.Context{Cluster: "drivers", AuthInfo: "drivers"}
	cfg.CurrentContext = "drivers"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ServiceAccountToken asks (as admin) for a two-hour token of namespace/name.
func ServiceAccountToken(ctx context.Context, env *k8stest.Env, namespace, name string) (string, error) {
	tr, err := env.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](2 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// StartProc starts bin with args and env (added to the test's), logging to <dir>/<name>.log; it
// is stopped (SIGTERM, then SIGKILL) when the test ends, and the end of its log is printed if the
// test failed.
func StartProc(t testing.TB, dir, name, bin string, env []string, args ...string) *process.Process {
	t.Helper()
	return StartProcIn(t, "", dir, name, bin, env, args...)
}

// StartProcIn is StartProc with the working directory workDir ("" is the test's), for a driver
// whose paths are relative to its container's working directory.
func StartProcIn(t testing.TB, workDir, dir, name, bin string, env []string, args ...string) *process.Process {
	t.Helper()
	p := process.New(process.Options{Name: name, Path: bin, Args: args, Env: append(os.Environ(), env...), Dir: workDir,
		LogFile: filepath.Join(dir, name+".log"), ProcessGroup: true})
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Logf("stopping %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("%s log, last 8 KiB:\n%s", name, p.TailLog(8<<10))
		}
	})
	return p
}

// FreePort returns a TCP port nobody listens on now.
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// ServeRegistration serves the kubelet plugin-registration API for the driver on
// <regDir>/<driver>-reg.sock, as node-driver-registrar does beside a node plugin (its module is
// not served by the module proxy here): the agent finds the socket, asks GetInfo and connects to
// endpoint. It keeps serving while the node plugin restarts, as the registrar container does.
func ServeRegistration(t testing.TB, regDir, driver, endpoint string) {
	t.Helper()
	sock := filepath.Join(regDir, driver+"-reg.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	registerapi.RegisterRegistrationServer(g, plugin.NewRegistrationServer(driver, endpoint))
	done := make(chan error, 1)
	go func() { done <- g.Serve(l) }()
	t.Cleanup(func() {
		g.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Logf("registrar: %v", err)
		}
		_ = os.Remove(sock)
	})
}
