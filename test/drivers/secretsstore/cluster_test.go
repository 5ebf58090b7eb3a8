//go:build drivers

package secretsstore_test

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

// spcGVR and spcpsGVR are the driver's two custom resources.
var (
	spcGVR   = schema.GroupVersionResource{Group: "secrets-store.csi.x-k8s.io", Version: "v1", Resource: "secretproviderclasses"}
	spcpsGVR = schema.GroupVersionResource{Group: "secrets-store.csi.x-k8s.io", Version: "v1", Resource: "secretproviderclasspodstatuses"}
	crdGVR   = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// repoRoot is the repository's root, from this package's directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..", "..")
}

// binary is one of the binaries make drivers-bins-secrets-store builds.
func binary(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(repoRoot(t), "bin", "drivers", "secrets-store", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%v: run make drivers-bins-secrets-store", err)
	}
	return p
}

// k8sBin is a binary of make e2e-bins (kube-controller-manager).
func k8sBin(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "bin", "k8s")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%v: run make e2e-bins", err)
	}
	return p
}

// moduleDir is the driver module's directory in the module cache, as the tools module resolves
// it: its manifests (CRDs, CSIDriver, RBAC) are applied from there, never retyped.
func moduleDir(t testing.TB) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", driverModule)
	cmd.Dir = filepath.Join(repoRoot(t), "test", "drivers", "secretsstore", "tools")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m %s in the tools module: %v", driverModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatalf("the module %s is not in the module cache: run make drivers-bins-secrets-store", driverModule)
	}
	return dir
}

// applier creates manifests' objects of any kind through the dynamic client.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(t testing.TB, cfg *rest.Config) *applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// create creates u, finding its resource by discovery (asked again once, for a CRD just
// established).
func (a *applier) create(ctx context.Context, u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		a.mapper.Reset()
		if m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			return fmt.Errorf("%s: %w", gvk, err)
		}
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if u.GetNamespace() != "" {
		ri = a.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	if _, err := ri.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// applyFile creates every object of the YAML file path that keep accepts (nil: all).
func (a *applier) applyFile(ctx context.Context, path string, keep func(*unstructured.Unstructured) bool) error {
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
		if err := a.create(ctx, u); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// waitEstablished waits until the CRD name is Established.
func (a *applier) waitEstablished(ctx context.Context, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		crd, err := a.dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
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

// tokenKubeconfig is a kubeconfig for base's server and CA with a bearer token, as the
// ServiceAccount's in-cluster configuration of a DaemonSet pod.
func tokenKubeconfig(t testing.TB, base *rest.Config, token string) []byte {
	t.Helper()
	return kubeconfig(t, base, &clientcmdapi.AuthInfo{Token: token})
}

// certKubeconfig is a kubeconfig for base's server and CA with cfg's client certificate.
func certKubeconfig(t testing.TB, base, cfg *rest.Config) []byte {
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

// serviceAccountToken asks (as admin) for a two-hour token of namespace/name.
func serviceAccountToken(ctx context.Context, env *k8stest.Env, namespace, name string) (string, error) {
	tr, err := env.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](2 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// startProc starts bin with args and env (added to the test's), logging to <dir>/<name>.log; it
// is stopped (SIGTERM, then SIGKILL) when the test ends, and the end of its log is printed if the
// test failed.
func startProc(t testing.TB, dir, name, bin string, env []string, args ...string) *process.Process {
	t.Helper()
	p := process.New(process.Options{Name: name, Path: bin, Args: args, Env: append(os.Environ(), env...),
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

// freePort returns a TCP port nobody listens on now.
func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// serveRegistration serves the kubelet plugin-registration API for the driver on
// <regDir>/<driver>-reg.sock, as node-driver-registrar does beside a node plugin (its module is
// not served by the module proxy here): the agent finds the socket, asks GetInfo and connects to
// endpoint. It keeps serving while the node plugin restarts, as the registrar container does.
func serveRegistration(t testing.TB, regDir, driver, endpoint string) {
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
