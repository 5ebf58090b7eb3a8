//go:build e2e

package identity_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/process"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/csrapprover"
)

const (
	// agentNamespace and agentServiceAccount are the agent DaemonSet's
	// (deploy/base), whose pod-bound token is the agent's bootstrap
	// credential; approverServiceAccount is csi-volmgr-csr-approver's.
	agentNamespace         = "csi-volmgr"
	agentServiceAccount    = "csi-volmgr"
	approverServiceAccount = "csi-volmgr-csr-approver"

	// probeUserAgent is the user agent of every request the test makes
	// with the agent's credentials, so that the audit log tells them from
	// the agent's own requests.
	probeUserAgent = "identity-e2e-probe"

	// timeout bounds every wait.
	timeout = 2 * time.Minute
)

// controlPlane is kube-apiserver (Node,RBAC and NodeRestriction, an audit
// log), kube-controller-manager and csi-volmgr's approver.
type controlPlane struct {
	env      *k8stest.Env
	dir      string
	auditLog string
	// kcm is kube-controller-manager.
	kcm *process.Process
	// approver is `csi-volmgr approve-node-csrs`, started by startApprover.
	approver *process.Process
}

// startControlPlane starts the API server and kube-controller-manager; the
// approver is set up but not started (startApprover).
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	dir := k8stest.KeptDir(t, "identity-e2e")
	cp := &controlPlane{dir: dir, auditLog: filepath.Join(dir, "audit.log")}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cp.env = k8stest.StartNodeRestricted(t, map[string][]string{
		"audit-policy-file": {policy},
		"audit-log-path":    {cp.auditLog},
		"audit-log-format":  {"json"},
		"audit-log-mode":    {"blocking"},
	})
	t.Logf("etcd and kube-apiserver (Node,RBAC; NodeRestriction) ready after %v", cp.env.StartupDuration.Round(time.Millisecond))

	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(admin, cp.env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	cp.kcm = startProc(t, dir, "kube-controller-manager", filepath.Join(binDir(t), "kube-controller-manager"),
		"--kubeconfig="+admin, "--leader-elect=false", "--secure-port=0",
		"--controllers=certificatesigningrequest-signing-controller,certificatesigningrequest-approving-controller,"+
			"certificatesigningrequest-cleaner-controller,persistentvolume-binder-controller,persistentvolume-attach-detach-controller",
		// The signer of kubernetes.io/kube-apiserver-client-kubelet.
		"--cluster-signing-kubelet-client-cert-file="+cp.env.Signer.CertFile,
		"--cluster-signing-kubelet-client-key-file="+cp.env.Signer.KeyFile,
		"--v=4")

	// The namespace and the RBAC of deploy/base: the agent's
	// ServiceAccount bound to system:node-bootstrapper and nothing else,
	// the approver's ServiceAccount with its ClusterRole.
	ctx := t.Context()
	if _, err := cp.env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"serviceaccount.yaml", "rbac.yaml", "csr-approver.yaml"} {
		applyRBAC(t, cp.env.Client, repoFile(t, filepath.Join("deploy", "base", f)))
	}

	// The approver runs as its ServiceAccount, with that ClusterRole only.
	token := serviceAccountToken(t, cp.env.Client, agentNamespace, approverServiceAccount, nil)
	kubeconfig := filepath.Join(dir, "approver.kubeconfig")
	if err := os.WriteFile(kubeconfig, tokenKubeconfig(t, cp.env.Config, token), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	health := "127.0.0.1:" + freePort(t)
	cp.approver = process.New(process.Options{
		Name: "csi-volmgr-approver", Path: bin, LogFile: filepath.Join(dir, "approver.log"), ProcessGroup: true,
		Args: []string{"approve-node-csrs", "--kubeconfig=" + kubeconfig,
			"--node-name-prefix=" + csrapprover.DefaultNodeNamePrefix,
			"--agent-service-account=" + agentNamespace + "/" + agentServiceAccount,
			"--health-endpoint=" + health, "--v=4"},
		Ready: func(ctx context.Context, _ int) error {
			return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				return httpOK(ctx, "http://"+health+"/healthz"), nil
			})
		},
	})
	closeAtCleanup(t, "csi-volmgr-approver", cp.approver)
	return cp
}

// startApprover starts csi-volmgr's approver and waits until it decides
// requests.
func (cp *controlPlane) startApprover(t *testing.T) {
	t.Helper()
	if err := cp.approver.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// stopApprover stops csi-volmgr's approver (SIGTERM; it must exit 0).
func (cp *controlPlane) stopApprover(t *testing.T) {
	t.Helper()
	if err := cp.approver.Stop(); err != nil {
		t.Fatal(err)
	}
}

func (cp *controlPlane) audit(t testing.TB) []auditEvent {
	t.Helper()
	events, err := readAudit(cp.auditLog)
	if err != nil {
		t.Fatal(err)
	}
	return events
}

func httpOK(ctx context.Context, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// applyRBAC creates the ServiceAccounts, ClusterRoles and
// ClusterRoleBindings of the manifest file path (other kinds are left
// out: this test runs no Deployment).
func applyRBAC(t *testing.T, client kubernetes.Interface, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	decode := scheme.Codecs.UniversalDeserializer().Decode
	ctx := t.Context()
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if strings.TrimSpace(string(doc)) == "" {
			continue
		}
		obj, _, err := decode(doc, nil, nil)
		if err != nil {
			if runtime.IsNotRegisteredError(err) {
				continue
			}
			t.Fatalf("%s: %v", path, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			continue
		}
		if err != nil {
			t.Fatalf("%s: creating %T: %v", path, obj, err)
		}
	}
}

// serviceAccountToken asks (as admin) for a token of namespace/name, bound
// to pod when it is not nil: with a pod binding the API server puts the
// pod's name and its Node's into the token (user extras
// authentication.kubernetes.io/pod-name and node-name).
func serviceAccountToken(t *testing.T, client kubernetes.Interface, namespace, name string, pod *corev1.Pod) string {
	t.Helper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](2 * 3600)}}
	if pod != nil {
		tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), name, tr, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// tokenKubeconfig is a kubeconfig for base's server and CA with a bearer
// token and nothing else.
func tokenKubeconfig(t *testing.T, base *rest.Config, token string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: base.Host, CertificateAuthorityData: base.CAData}
	cfg.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	cfg.CurrentContext = "e2e"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// tokenConfig is base's server and CA with a bearer token, as the test's
// probe.
func tokenConfig(base *rest.Config, token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(base)
	cfg.BearerToken = token
	cfg.UserAgent = probeUserAgent
	return cfg
}

// waitFor polls cond every 100 ms until it holds, failing t after timeout.
func waitFor(t testing.TB, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func whoAmI(t testing.TB, cfg *rest.Config) authenticationv1.UserInfo {
	t.Helper()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo
}

func mustClient(t testing.TB, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
