package csrapprover_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/csrapprover"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

// approverRules is the RBAC the approver needs, as the package says.
var approverRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests/approval"}, Verbs: []string{"update"}},
	{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, Verbs: []string{"approve"},
		ResourceNames: []string{csrapprover.SignerName}},
}

// grant binds a ClusterRole of rules to subject.
func grant(t *testing.T, client kubernetes.Interface, name string, rules []rbacv1.PolicyRule, subject rbacv1.Subject) {
	t.Helper()
	rbac := client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{subject},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// allowRequesters lets every authenticated user create requests, once
// per API server.
func allowRequesters(t *testing.T, env *k8stest.Env) {
	t.Helper()
	requestersOnce.Do(func() {
		grant(t, env.Client, "csrapprover-test-requesters", []rbacv1.PolicyRule{{
			APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get"},
		}}, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"})
	})
}

var requestersOnce sync.Once

// requester is an identity a request is created as, through impersonation:
// the API server records its user name, groups and extras in the
// request's spec, as for a real token or certificate.
type requester struct {
	user   string
	groups []string
	extra  map[string][]string
}

func agentPod(node, pod string) requester {
	return requester{user: "system:serviceaccount:csi-volmgr:csi-volmgr",
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:csi-volmgr"},
		extra:  map[string][]string{csrapprover.ExtraNodeName: {node}, csrapprover.ExtraPodName: {pod}}}
}

// createCSR creates the request name for system:node:<node> as who.
func createCSR(t *testing.T, admin *rest.Config, who requester, name, node string, usages ...certificatesv1.KeyUsage) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(usages) == 0 {
		usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	}
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: who.user, Groups: who.groups, Extra: who.extra}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: csrapprover.SignerName,
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			Usages:     usages,
		},
	}
	created, err := client.CertificatesV1().CertificateSigningRequests().Create(t.Context(), csr, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating CSR %s as %s: %v", name, who.user, err)
	}
	if created.Spec.Username != who.user {
		t.Fatalf("CSR %s: requester %q, want %q", name, created.Spec.Username, who.user)
	}
	for k, v := range who.extra {
		if got := created.Spec.Extra[k]; len(got) != len(v) || (len(v) > 0 && got[0] != v[0]) {
			t.Fatalf("CSR %s: extra %s is %q, want %q", name, k, got, v)
		}
	}
}

// startApprover runs an approver as user until the test ends.
func startApprover(t *testing.T, env *k8stest.Env, user string, logger klog.Logger) *csrapprover.Controller {
	t.Helper()
	cfg, err := env.AddUser(user)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// One worker: requests are decided in the order they were created, so
	// when the last one is decided, those left pending were seen and left
	// alone.
	c, err := csrapprover.New(csrapprover.Config{Client: client, Rules: csrapprover.DefaultRules(), Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(klog.NewContext(t.Context(), logger)) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("approver %s: %v", user, err)
		}
	})
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return c.Running(), nil
	}); err != nil {
		t.Fatalf("approver %s not running: %v", user, err)
	}
	return c
}

// kubectlGetCSR returns the CONDITION column of `kubectl get csr` by name.
func kubectlGetCSR(t *testing.T, env *k8stest.Env) map[string]string {
	t.Helper()
	dir := os.Getenv(k8stest.AssetsEnv)
	if dir == "" {
		dir = filepath.Join("..", "..", "bin", "k8s")
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), filepath.Join(dir, "kubectl"), "--kubeconfig", kubeconfig, "get", "csr", "--no-headers")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl get csr: %v\n%s", err, stderr.String())
	}
	t.Logf("kubectl get csr:\n%s", stdout.String())
	out := map[string]string{}
	for line := range strings.Lines(stdout.String()) {
		if f := strings.Fields(line); len(f) > 1 {
			out[f[0]] = f[len(f)-1]
		}
	}
	return out
}

// decisionLines counts the log lines of decisions on the CSR name.
func decisionLines(logs, name string) int {
	n := 0
	for line := range strings.Lines(logs) {
		if (strings.Contains(line, "Approved a node client CSR") || strings.Contains(line, "Denied a node client CSR")) &&
			strings.Contains(line, `csr="`+name+`"`) {
			n++
		}
	}
	return n
}

// TestApproverOnAPIServer creates requests as the requesters of every
// path, and a kubelet's and others', and checks what `kubectl get csr`
// shows once the approver (with only the RBAC it documents) decided them.
func TestApproverOnAPIServer(t *testing.T) {
	env := k8stest.Shared(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	allowRequesters(t, env)
	grant(t, env.Client, "csrapprover-test-approver", approverRules,
		rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "csrapprover-test"})
	startApprover(t, env, "csrapprover-test", logger)

	nodeUser := func(name string) requester {
		return requester{user: "system:node:" + name, groups: []string{"system:nodes"}}
	}
	cases := []struct {
		name, node string
		who        requester
		usages     []certificatesv1.KeyUsage
		want       string // the CONDITION column
		words      string // in the condition's message
	}{
		// Created first: left alone, for the built-in approver or an admin.
		{name: "kubelet-renewal", node: "worker1", who: nodeUser("worker1"), want: "Pending"},
		{name: "kubeadm-bootstrap", node: "worker2",
			who:  requester{user: "system:bootstrap:abcdef", groups: []string{"system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token"}},
			want: "Pending"},
		{name: "other-serviceaccount", node: "csi-volmgr-h1",
			who: requester{user: "system:serviceaccount:kube-system:other", groups: []string{"system:serviceaccounts"},
				extra: map[string][]string{csrapprover.ExtraNodeName: {"h1"}, csrapprover.ExtraPodName: {"p1"}}},
			want: "Pending"},
		// The agent's requests.
		{name: "agent-h1", node: "csi-volmgr-h1", who: agentPod("h1", "csi-volmgr-abcde"), want: "Approved", words: "runs on node h1 (token bound to pod csi-volmgr-abcde)"},
		{name: "agent-h1-for-h2", node: "csi-volmgr-h2", who: agentPod("h1", "csi-volmgr-abcde"), want: "Denied",
			words: "requester runs on node h1 (token bound to pod csi-volmgr-abcde); the CSR asks for system:node:csi-volmgr-h2"},
		{name: "agent-unbound-token", node: "csi-volmgr-h1",
			who:  requester{user: "system:serviceaccount:csi-volmgr:csi-volmgr", groups: []string{"system:serviceaccounts"}},
			want: "Denied", words: "no token bound to one pod"},
		{name: "agent-server-auth", node: "csi-volmgr-h1", who: agentPod("h1", "p"),
			usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}, want: "Denied", words: "usages"},
		{name: "renewal-h1", node: "csi-volmgr-h1", who: nodeUser("csi-volmgr-h1"), want: "Approved", words: "renewal by node csi-volmgr-h1 itself"},
		{name: "renewal-h1-for-h3", node: "csi-volmgr-h3", who: nodeUser("csi-volmgr-h1"), want: "Denied",
			words: "requester is node csi-volmgr-h1; the CSR asks for system:node:csi-volmgr-h3"},
		{name: "edge-e1", node: "csi-volmgr-e1",
			who:  requester{user: "system:bootstrap:e1e1e1", groups: []string{"system:bootstrappers", "system:bootstrappers:csi-volmgr:csi-volmgr-e1"}},
			want: "Approved", words: "bootstrap token system:bootstrap:e1e1e1"},
		{name: "edge-e1-for-e2", node: "csi-volmgr-e2",
			who:  requester{user: "system:bootstrap:e1e1e1", groups: []string{"system:bootstrappers", "system:bootstrappers:csi-volmgr:csi-volmgr-e1"}},
			want: "Denied", words: "bootstrap token for node csi-volmgr-e1; the CSR asks for system:node:csi-volmgr-e2"},
	}
	for _, tc := range cases {
		createCSR(t, env.Config, tc.who, tc.name, tc.node, tc.usages...)
	}
	csrs := env.Client.CertificatesV1().CertificateSigningRequests()
	last := cases[len(cases)-1].name
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		csr, err := csrs.Get(ctx, last, metav1.GetOptions{})
		return err == nil && len(csr.Status.Conditions) > 0, err
	}); err != nil {
		t.Fatalf("CSR %s not decided: %v", last, err)
	}

	shown := kubectlGetCSR(t, env)
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, tc := range cases {
		if shown[tc.name] != tc.want {
			t.Errorf("kubectl get csr %s: %q, want %q", tc.name, shown[tc.name], tc.want)
		}
		csr, err := csrs.Get(t.Context(), tc.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lines := decisionLines(logs, tc.name)
		if tc.want == "Pending" {
			if len(csr.Status.Conditions) != 0 || lines != 0 {
				t.Errorf("CSR %s of %s: conditions %+v, %d log lines; want it left alone", tc.name, tc.who.user, csr.Status.Conditions, lines)
			}
			continue
		}
		if len(csr.Status.Conditions) != 1 {
			t.Errorf("CSR %s: conditions %+v, want one", tc.name, csr.Status.Conditions)
			continue
		}
		cond := csr.Status.Conditions[0]
		wantReason := map[string]string{"Approved": csrapprover.ConditionReasonApprove, "Denied": csrapprover.ConditionReasonDeny}[tc.want]
		if cond.Reason != wantReason || !strings.Contains(cond.Message, tc.words) {
			t.Errorf("CSR %s: reason %q message %q, want reason %q and a message with %q", tc.name, cond.Reason, cond.Message, wantReason, tc.words)
		}
		if lines != 1 {
			t.Errorf("CSR %s: %d log lines name it, want one", tc.name, lines)
		}
	}
}

// TestTwoApproversDecideOnce: two approvers at once (two replicas, or an
// old and a new one during a rollout) write one decision per request: the
// second write carries a stale resourceVersion, fails with Conflict, and
// the retry finds the request decided.
func TestTwoApproversDecideOnce(t *testing.T) {
	env := k8stest.Shared(t)
	allowRequesters(t, env)
	var loggers []klog.Logger
	for _, user := range []string{"csrapprover-twice-a", "csrapprover-twice-b"} {
		grant(t, env.Client, user, approverRules, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user})
		logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
		loggers = append(loggers, logger)
		startApprover(t, env, user, logger)
	}
	want := map[string]certificatesv1.RequestConditionType{}
	for i := range 10 {
		name := fmt.Sprintf("twice-%d", i)
		node, typ := fmt.Sprintf("csi-volmgr-t%d", i), certificatesv1.CertificateApproved
		if i%2 == 1 {
			node, typ = "csi-volmgr-elsewhere", certificatesv1.CertificateDenied
		}
		createCSR(t, env.Config, agentPod(fmt.Sprintf("t%d", i), "p"), name, node)
		want[name] = typ
	}
	csrs := env.Client.CertificatesV1().CertificateSigningRequests()
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		for name := range want {
			csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
			if err != nil || len(csr.Status.Conditions) == 0 {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("not all decided: %v", err)
	}
	// Both approvers have seen every request's decision once the watch
	// delivered it; give a loser's retry the time to run.
	time.Sleep(time.Second)
	for name, typ := range want {
		csr, err := csrs.Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(csr.Status.Conditions) != 1 || csr.Status.Conditions[0].Type != typ {
			t.Errorf("CSR %s: conditions %+v, want one %s", name, csr.Status.Conditions, typ)
		}
		lines := 0
		for _, l := range loggers {
			lines += decisionLines(l.GetSink().(ktesting.Underlier).GetBuffer().String(), name)
		}
		if lines != 1 {
			t.Errorf("CSR %s: %d decision log lines, want one", name, lines)
		}
	}
}
