package deploy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

const (
	// approverName is deploy/base's approver: Deployment, ServiceAccount
	// and ClusterRole.
	approverName = "csi-volmgr-csr-approver"
	// approvedReason is the reason of the approver's Approved condition
	// (csrapprover.ConditionReasonApprove), deniedReason of its Denied.
	approvedReason = "CSIVolmgrApprove"
	deniedReason   = "CSIVolmgrDeny"
	// firstCertificate is how long the test's signer makes the agent's
	// first certificate valid: short, so that the agent renews it (at 70 to
	// 90 % of its life) while the scenario runs, as its Node.
	firstCertificate = time.Minute
	// renewedCertificate is the validity of the certificates that follow.
	renewedCertificate = 24 * time.Hour
	// approverTimeout bounds the wait for a verdict of the approver.
	approverTimeout = time.Minute
)

// kindApprover renders deploy/kind and returns the approver's container and
// the grants bound to its ServiceAccount.
func kindApprover(t *testing.T, env *k8stest.Env) (*corev1.Container, []grant) {
	t.Helper()
	objs := render(t, "kind")
	dep := convert[appsv1.Deployment](t, find(t, objs, "Deployment", agentNamespace, approverName))
	if len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment %s has %d containers, want 1", approverName, len(dep.Spec.Template.Spec.Containers))
	}
	return &dep.Spec.Template.Spec.Containers[0], agentGrants(t, env, objs, dep.Namespace, dep.Spec.Template.Spec.ServiceAccountName)
}

// approverOptions vary startApprover.
type approverOptions struct {
	// NoWait returns at once, not once /healthz says the approver watches
	// the requests.
	NoWait bool
	// ListAndWatch turns client-go's WatchListClient gate off: the
	// informer then lists and watches, as against an API server that
	// serves no watch-list stream.
	ListAndWatch bool
}

// approverProcess is `csi-volmgr approve-node-csrs` as a process.
type approverProcess struct {
	*process.Process
	// User is its ServiceAccount's user.
	User string
}

// startApprover runs the approver of the Deployment's container with its
// exact arguments but two: its agent ServiceAccount is the one in the
// test's namespace ns (the manifests' csi-volmgr/csi-volmgr moved there),
// its /healthz on a free loopback port. It acts as a ServiceAccount of its
// own in ns with grants. Cleanups stop it.
func startApprover(t *testing.T, env *k8stest.Env, c *corev1.Container, grants []grant, ns string, o approverOptions) *approverProcess {
	t.Helper()
	ctx := t.Context()
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: approverName}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the approver's ServiceAccount: %v", err)
	}
	installGrants(t, env, grants, ns, ns, approverName)
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, approverName, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the approver's token: %v", err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeTokenKubeconfig(env, tr.Status.Token, kubeconfig); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := l.Addr().String()
	_ = l.Close()

	if len(c.Args) == 0 || c.Args[0] != "approve-node-csrs" || len(c.Command) > 0 {
		t.Fatalf("the approver's container runs %q %q, want the image's entrypoint with approve-node-csrs", c.Command, c.Args)
	}
	overrides := map[string]string{"agent-service-account": ns + "/" + agentName, "health-endpoint": health}
	args := slices.Clone(c.Args)
	for i, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if v, ok := overrides[name]; ok {
			args[i] = "--" + name + "=" + v
			delete(overrides, name)
		}
	}
	if len(overrides) > 0 {
		t.Fatalf("the approver's container does not set %v", overrides)
	}
	args = append(args, "--kubeconfig="+kubeconfig)
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "approver.log")
	a := &approverProcess{
		Process: process.New(process.Options{
			Name: "approver", Path: bin, Args: args, LogFile: logFile, StopTimeout: agentStopTimeout,
			Env: append(os.Environ(), fmt.Sprintf("KUBE_FEATURE_WatchListClient=%t", !o.ListAndWatch)),
		}),
		User: "system:serviceaccount:" + ns + ":" + approverName,
	}
	if err := a.Start(ctx); err != nil {
		t.Fatalf("starting the approver: %v", err)
	}
	t.Cleanup(func() {
		if err := a.Stop(); err != nil {
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == raceExitCode {
				t.Errorf("the approver: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("approver command line: %q\napprover log, last %d bytes:\n%s", args, agentLogTail, a.TailLog(agentLogTail))
		}
	})
	if o.NoWait {
		return a
	}
	err = wait.PollUntilContextTimeout(ctx, pollInterval, approverTimeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-a.Exited():
			return false, fmt.Errorf("the approver exited: %w", a.ExitErr())
		default:
		}
		code, _, err := get(ctx, http.DefaultClient, "http://"+health+"/healthz", "")
		return err == nil && code == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("the approver's /healthz: %v\n%s", err, a.TailLog(agentLogTail))
	}
	return a
}

// signApproved plays kube-controller-manager's csrsigning controller for
// the requests of users until the test ends: it signs every approved
// kubelet client request of theirs with the API server's node signer,
// first valid for firstCertificate, later ones for renewedCertificate.
func signApproved(t *testing.T, env *k8stest.Env, users ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	csrs := env.Client.CertificatesV1().CertificateSigningRequests()
	signed := 0
	wg.Go(func() {
		_ = wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
			list, err := csrs.List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for i := range list.Items {
				csr := &list.Items[i]
				if !slices.Contains(users, csr.Spec.Username) || csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName ||
					len(csr.Status.Certificate) > 0 || !hasCondition(csr, certificatesv1.CertificateApproved) {
					continue
				}
				validity := renewedCertificate
				if signed == 0 {
					validity = firstCertificate
				}
				cert, err := env.Signer.SignRequest(csr.Spec.Request, validity)
				if err != nil {
					t.Errorf("signing %s: %v", csr.Name, err)
					return true, nil
				}
				csr.Status.Certificate = cert
				if _, err := csrs.UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err == nil {
					signed++
				}
			}
			return false, nil
		})
	})
}

// hasCondition tells whether csr has the condition of type typ.
func hasCondition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) bool {
	return slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool { return c.Type == typ })
}

// requestsOf returns the kubelet client requests that user made.
func requestsOf(tb testing.TB, env *k8stest.Env, user string) []certificatesv1.CertificateSigningRequest {
	tb.Helper()
	list, err := env.Client.CertificatesV1().CertificateSigningRequests().List(tb.Context(), metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return slices.DeleteFunc(list.Items, func(csr certificatesv1.CertificateSigningRequest) bool {
		return csr.Spec.Username != user || csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName
	})
}

// issuedBy tells whether csr was approved by the approver and issued.
func issuedBy(csr certificatesv1.CertificateSigningRequest) bool {
	return len(csr.Status.Certificate) > 0 && slices.ContainsFunc(csr.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
		return c.Type == certificatesv1.CertificateApproved && c.Reason == approvedReason
	})
}

// TestAgentBootstrapsThroughApprover runs deploy/kind's agent as in
// TestAgentWithDaemonSetRBAC, but without a certificate: with its
// ServiceAccount's token bound to its pod on its host and the manifests'
// RBAC it asks for system:node:csi-volmgr-<host>; deploy/kind's approver,
// with its exact arguments and RBAC, approves the request; the test signs
// it as kube-controller-manager would, valid for a minute; the agent acts
// as its Node through the whole scenario and renews its certificate as its
// Node, which the approver approves too. No request of the agent or of the
// approver is denied, and the agent never reads a request by name (the get
// of notAskedByAgent).
func TestAgentBootstrapsThroughApprover(t *testing.T) {
	env, audit := apiServer(t)
	agent, grants := kindAgent(t, env)
	approverC, approverGrants := kindApprover(t, env)
	var approver *approverProcess
	s := runWithoutDenials(t, env, audit, agent, grants, scenarioOptions{WatchList: true, Bootstrap: true}, func(s *scenario) {
		signApproved(t, env, s.BootstrapUser, s.User)
		approver = startApprover(t, env, approverC, approverGrants, s.f.Namespace, approverOptions{})
	})

	first := requestsOf(t, env, s.BootstrapUser)
	if len(first) != 1 || !issuedBy(first[0]) {
		t.Errorf("the ServiceAccount's requests: %+v; want one, approved by the approver (%s) and issued", first, approvedReason)
	}
	// The renewal, as the Node: at 70 to 90 % of the first certificate's
	// minute.
	ctx, cancel := context.WithTimeout(t.Context(), firstCertificate+approverTimeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (bool, error) {
		return slices.ContainsFunc(requestsOf(t, env, s.User), issuedBy), nil
	})
	if err != nil {
		t.Errorf("no renewal of %s's certificate approved by the approver and issued: %v", s.User, err)
	}
	cert := currentCertificate(t, filepath.Join(s.agent.Root, "pki", certPairFile))
	if cert.Subject.CommonName != s.User || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("the agent's certificate is for %s %v, want %s [system:nodes]", cert.Subject.CommonName, cert.Subject.Organization, s.User)
	}
	time.Sleep(time.Second) // the audit entries of the last requests
	checkNoDenials(t, audit, s.User, s.BootstrapUser, approver.User)
	events, err := audit.Events(s.BootstrapUser)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events {
		if ev.access() == csrAccess("get") {
			t.Errorf("the agent read a request by name (%s): %s is needed after all", ev.RequestURI, csrAccess("get"))
		}
	}
}

// currentCertificate reads the certificate of a PEM certificate-and-key
// file.
func currentCertificate(tb testing.TB, path string) *x509.Certificate {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				tb.Fatal(err)
			}
			return cert
		}
	}
	tb.Fatalf("%s holds no certificate", path)
	return nil
}

// agentRequester is the DaemonSet's ServiceAccount with a token bound to
// its pod on a host: what asks for the agent's first certificate.
type agentRequester struct {
	Client kubernetes.Interface
	User   string
	Host   string
}

// newAgentRequester creates the agent's ServiceAccount with the grants of
// deploy/kind's and a pod of it on a host in ns, and returns a client with
// the pod's token.
func newAgentRequester(t *testing.T, env *k8stest.Env, ns string) agentRequester {
	t.Helper()
	host := "h-" + ns
	_, grants := kindAgent(t, env)
	_, token := agentPodToken(t, env.Client, ns, host)
	installGrants(t, env, grants, ns, ns, agentName)
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return agentRequester{Client: client, User: "system:serviceaccount:" + ns + ":" + agentName, Host: host}
}

// requestNodeCertificate creates a kubelet client request for
// system:node:<node> with a fresh key, as client-go's certificate manager
// does, and returns its name.
func requestNodeCertificate(t *testing.T, env *k8stest.Env, client kubernetes.Interface, node string) string {
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
	csr, err := client.CertificatesV1().CertificateSigningRequests().Create(t.Context(), &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "csr-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a request for system:node:%s: %v", node, err)
	}
	t.Cleanup(func() {
		ignoreNotFound(t, env.Client.CertificatesV1().CertificateSigningRequests().Delete(cleanupContext(t), csr.Name, metav1.DeleteOptions{}))
	})
	return csr.Name
}

// waitVerdict waits until the request name has an Approved or Denied
// condition, and returns it.
func waitVerdict(ctx context.Context, env *k8stest.Env, name string) (certificatesv1.CertificateSigningRequestCondition, error) {
	w, err := env.Client.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.SingleObject(metav1.ObjectMeta{Name: name}))
	if err != nil {
		return certificatesv1.CertificateSigningRequestCondition{}, err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		csr, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
		if !ok || ev.Type == watch.Deleted {
			continue
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
				return c, nil
			}
		}
	}
	return certificatesv1.CertificateSigningRequestCondition{}, fmt.Errorf("no verdict on %s: %w", name, context.Cause(ctx))
}

// TestApproverVerdicts runs deploy/kind's approver with its arguments and
// RBAC and asks it, as the agent's ServiceAccount with a token bound to its
// pod on host H, for the agent's Node certificate (approved) and for
// another Node's (denied): a host's ServiceAccount token gets that host's
// agent Node, and no other.
func TestApproverVerdicts(t *testing.T) {
	env, _ := apiServer(t)
	c, grants := kindApprover(t, env)
	f := env.NewFixture(t)
	startApprover(t, env, c, grants, f.Namespace, approverOptions{})
	req := newAgentRequester(t, env, f.Namespace)
	prefix, _ := flagValue(c.Args, "node-name-prefix")
	for node, want := range map[string]string{
		prefix + req.Host:             approvedReason, // the agent on H
		prefix + "other-" + req.Host:  deniedReason,   // another host's agent
		req.Host:                      deniedReason,   // H's own Node, its kubelet's
		"kube-system-" + prefix + "x": deniedReason,   // not an agent's Node
	} {
		t.Run(node, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), approverTimeout)
			defer cancel()
			cond, err := waitVerdict(ctx, env, requestNodeCertificate(t, env, req.Client, node))
			if err != nil {
				t.Fatal(err)
			}
			if cond.Reason != want {
				t.Errorf("system:node:%s asked by %s on %s: %s %s (%s), want %s", node, req.User, req.Host, cond.Type, cond.Reason, cond.Message, want)
			}
		})
	}
}

// approverNeeds maps an access of the approver's ClusterRole to the request
// that is denied without it: approving a request of a signer is checked on
// the approval's update.
var approverNeeds = map[access]access{
	{Verb: "approve", Group: "certificates.k8s.io", Resource: "signers"}: {Verb: "update", Group: "certificates.k8s.io", Resource: "certificatesigningrequests/approval"},
}

// TestApproverRBACLeastPrivilege removes each verb of the approver's
// ClusterRole in turn and shows that the approver then needs it: asked for
// the agent's Node certificate, it is denied that very request (or, for
// approve on its signer, the approval it writes).
func TestApproverRBACLeastPrivilege(t *testing.T) {
	env, audit := apiServer(t)
	c, grants := kindApprover(t, env)
	prefix, _ := flagValue(c.Args, "node-name-prefix")
	for _, acc := range accesses(grants) {
		t.Run(strings.ReplaceAll(acc.String(), "/", "_"), func(t *testing.T) {
			t.Parallel()
			want, ok := approverNeeds[acc]
			if !ok {
				want = acc
			}
			f := env.NewFixture(t)
			req := newAgentRequester(t, env, f.Namespace)
			approverUser := "system:serviceaccount:" + f.Namespace + ":" + approverName
			ctx, cancel := context.WithTimeout(t.Context(), approverTimeout)
			defer cancel()
			// Without list or watch the approver never says it is
			// healthy: no wait for it. "list" is the informer's fallback
			// when the API server serves no watch-list stream: that case
			// runs the approver as against such a server.
			startApprover(t, env, c, without(grants, acc), f.Namespace, approverOptions{NoWait: true, ListAndWatch: acc.Verb == "list"})
			requestNodeCertificate(t, env, req.Client, prefix+req.Host)
			ev, err := audit.WaitDenied(ctx, approverUser, want)
			if err != nil {
				t.Fatalf("without %s: %v", acc, err)
			}
			t.Logf("without %s: denied %s", acc, ev.RequestURI)
		})
	}
}
