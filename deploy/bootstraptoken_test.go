package deploy_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const bootstrapTokenScript = "systemd/bootstrap-token.sh"

// runBootstrapToken runs bootstrap-token.sh with args, kubectl and the
// admin kubeconfig of env, and returns its standard output and error.
func runBootstrapToken(t *testing.T, env *k8stest.Env, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	admin := filepath.Join(t.TempDir(), "admin-kubeconfig")
	if err := os.WriteFile(admin, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(t.Context(), "bash", append([]string{bootstrapTokenScript}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+admin, "KUBECTL="+kubectl(t))
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// bootstrapClient returns a client of the kubeconfig bootstrap-token.sh
// printed.
func bootstrapClient(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(kubeconfig))
	if err != nil {
		t.Fatalf("the script's kubeconfig: %v\n%s", err, kubeconfig)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// TestSystemdBootstrapToken runs deploy/systemd/bootstrap-token.sh against
// the API server (with bootstrap token authentication, as kubeadm's) and
// with deploy/systemd's binding and deploy/kind's approver: the kubeconfig
// it prints authenticates as a bootstrap token in the groups
// system:bootstrappers:csi-volmgr and system:bootstrappers:csi-volmgr:<node>,
// may ask for a certificate and nothing of escalations, gets
// system:node:<node> approved and another Node's denied, and stops
// authenticating once its TTL has passed. Node names the approver would
// never serve, and TTLs that are not durations, are refused before any
// token is made.
func TestSystemdBootstrapToken(t *testing.T) {
	env, _ := apiServer(t)
	ctx := t.Context()
	f := env.NewFixture(t)
	node := approverNodeNamePrefix(t) + "edge-" + utilrand.String(6)
	t.Cleanup(func() {
		ignoreNotFound(t, env.Client.CoreV1().Secrets("kube-system").DeleteCollection(cleanupContext(t), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: "csi-volmgr.io/bootstrap-node=" + node}))
	})

	binding := convert[rbacv1.ClusterRoleBinding](t, find(t, render(t, "systemd"), "ClusterRoleBinding", "", "csi-volmgr-bootstrappers"))
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ignoreNotFound(t, env.Client.RbacV1().ClusterRoleBindings().Delete(cleanupContext(t), binding.Name, metav1.DeleteOptions{}))
	})

	kubeconfig, stderr, err := runBootstrapToken(t, env, node, "1h")
	if err != nil {
		t.Fatalf("bootstrap-token.sh %s 1h: %v\n%s", node, err, stderr)
	}
	t.Logf("bootstrap-token.sh: %s", strings.TrimSpace(stderr))
	client := bootstrapClient(t, kubeconfig)
	var review *authenticationv1.SelfSubjectReview
	err = wait.PollUntilContextTimeout(ctx, pollInterval, authorizeTimeout, true, func(ctx context.Context) (bool, error) {
		review, err = client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the token does not authenticate: %v", err)
	}
	ui := review.Status.UserInfo
	wantGroups := []string{"system:bootstrappers:csi-volmgr", "system:bootstrappers:csi-volmgr:" + node}
	if !strings.HasPrefix(ui.Username, "system:bootstrap:") || !slices.Contains(ui.Groups, wantGroups[0]) || !slices.Contains(ui.Groups, wantGroups[1]) {
		t.Errorf("the token is %s %v, want system:bootstrap:<id> in %v", ui.Username, ui.Groups, wantGroups)
	}
	for _, attrs := range escalations {
		if ok, err := sar(ctx, env, ui.Username, ui.Groups, attrs); err != nil || ok {
			t.Errorf("the bootstrap token may %s %s/%s (%v)", attrs.Verb, attrs.Resource, attrs.Subresource, err)
		}
	}
	secret, err := env.Client.CoreV1().Secrets("kube-system").Get(ctx, "bootstrap-token-"+strings.TrimPrefix(ui.Username, "system:bootstrap:"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if secret.Type != corev1.SecretTypeBootstrapToken || string(secret.Data["usage-bootstrap-signing"]) == "true" {
		t.Errorf("the token's Secret: type %s, data %v: want a bootstrap token for authentication only", secret.Type, secret.Data)
	}
	if exp, err := time.Parse(time.RFC3339, string(secret.Data["expiration"])); err != nil || time.Until(exp) > time.Hour || time.Until(exp) < 50*time.Minute {
		t.Errorf("the token expires %q (%v), want in an hour", secret.Data["expiration"], err)
	}

	// The approver serves the token's Node, and only it.
	c, grants := kindApprover(t, env)
	startApprover(t, env, c, grants, f.Namespace, approverOptions{})
	for n, want := range map[string]string{node: approvedReason, node + "-other": deniedReason} {
		wctx, cancel := context.WithTimeout(ctx, approverTimeout)
		cond, err := waitVerdict(wctx, env, requestNodeCertificate(t, env, client, n))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if cond.Reason != want {
			t.Errorf("system:node:%s asked by the bootstrap token of %s: %s %s (%s), want %s", n, node, cond.Type, cond.Reason, cond.Message, want)
		}
	}

	// A token past its TTL authenticates no more.
	short, stderr, err := runBootstrapToken(t, env, node, "2s")
	if err != nil {
		t.Fatalf("bootstrap-token.sh %s 2s: %v\n%s", node, err, stderr)
	}
	expired := bootstrapClient(t, short)
	err = wait.PollUntilContextTimeout(ctx, pollInterval, authorizeTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := expired.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		return apierrors.IsUnauthorized(err), nil
	})
	if err != nil {
		t.Errorf("a token of 2s still authenticates: %v", err)
	}

	refused := [][]string{
		{"edge-1"},                             // not a Node the approver serves
		{approverNodeNamePrefix(t) + "edge.1"}, // no dots in a group name
		{approverNodeNamePrefix(t) + "Edge"},
		{node + "-ttl", "1y"},
		{node + "-ttl", "0h"},
		{},
	}
	for _, args := range refused {
		if out, stderr, err := runBootstrapToken(t, env, args...); err == nil || out != "" {
			t.Errorf("bootstrap-token.sh %q: %v, printed %q; want a refusal (stderr %q)", args, err, out, stderr)
		}
	}
	secrets, err := env.Client.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "csi-volmgr.io/bootstrap-node"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		n := s.Labels["csi-volmgr.io/bootstrap-node"]
		if slices.ContainsFunc(refused, func(args []string) bool { return len(args) > 0 && args[0] == n }) {
			t.Errorf("a refused run made the token Secret %s for %q", s.Name, n)
		}
	}
}
