package nodeidentity_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/nodeidentity"
)

// nodeAPIServer is a kube-apiserver as kubeadm and kind run it, the Node
// authorizer and NodeRestriction on, trusting the Env's Signer.
func nodeAPIServer(t *testing.T) *k8stest.Env {
	t.Helper()
	env, err := k8stest.Start(k8stest.Options{
		NodeClientSigner: true,
		APIServerFlags: map[string][]string{
			"authorization-mode":       {"Node,RBAC"},
			"enable-admission-plugins": {"NodeRestriction"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	return env
}

// bootstrapper is a user bound to the built-in ClusterRole
// system:node-bootstrapper, and nothing else: what the agent's bootstrap
// credentials are given.
func bootstrapper(t *testing.T, env *k8stest.Env) *rest.Config {
	t.Helper()
	name := k8stest.UniqueName("bootstrapper")
	cfg, err := env.AddUser(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// signed is what the test's signer did with one CSR.
type signed struct {
	name, requester, cn string
}

// signer approves and signs every kubelet client CSR with env's Signer for
// validity, as kube-controller-manager's approver and csrsigning
// controller would (this package's test runs without the controller
// manager; test/identity runs with it), and records what it signed.
func signer(t *testing.T, env *k8stest.Env, validity time.Duration) func() []signed {
	t.Helper()
	var (
		mu   sync.Mutex
		done []signed
	)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		seen := map[string]bool{}
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			list, err := env.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil //nolint:nilerr // retried
			}
			for i := range list.Items {
				csr := &list.Items[i]
				if seen[csr.Name] || csr.Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
					continue
				}
				csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
					Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "test signer",
				})
				csr, err = env.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
				if err != nil {
					continue
				}
				cert, err := env.Signer.SignRequest(csr.Spec.Request, validity)
				if err != nil {
					t.Errorf("signing %s: %v", csr.Name, err)
					continue
				}
				csr.Status.Certificate = cert
				if _, err := env.Client.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
					continue
				}
				seen[csr.Name] = true
				block, _ := pem.Decode(csr.Spec.Request)
				req, _ := x509.ParseCertificateRequest(block.Bytes)
				mu.Lock()
				done = append(done, signed{name: csr.Name, requester: csr.Spec.Username, cn: req.Subject.CommonName})
				mu.Unlock()
			}
			return false, nil
		})
	})
	return func() []signed {
		mu.Lock()
		defer mu.Unlock()
		return append([]signed(nil), done...)
	}
}

// whoAmI is the user the API server sees for cfg.
func whoAmI(t *testing.T, cfg *rest.Config) authenticationv1.UserInfo {
	t.Helper()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return review.Status.UserInfo
}

// TestStartActsAsTheNodeAndRenews: with nothing in the certificate
// directory the bootstrap credentials ask for system:node:<name>; the
// client then is that Node and nothing else (a Secret is refused, as the
// Node authorizer refuses a kubelet); the certificate is renewed before it
// expires with the Node's own certificate as the requester, and the client
// goes on working with the new one; a second start reuses the stored
// certificate and asks for none.
func TestStartActsAsTheNodeAndRenews(t *testing.T) {
	env := nodeAPIServer(t)
	// A 40 s certificate is renewed after 28–36 s (70–90 % of it).
	signedCSRs := signer(t, env, 40*time.Second)
	dir := filepath.Join(t.TempDir(), "pki")
	node := "n1"

	ctx, cancel := context.WithCancel(t.Context())
	id, err := nodeidentity.Start(ctx, nodeidentity.Options{NodeName: node, CertDir: dir, Bootstrap: bootstrapper(t, env)})
	if err != nil {
		t.Fatal(err)
	}
	user := whoAmI(t, id.Config())
	if user.Username != "system:node:n1" || !contains(user.Groups, "system:nodes") {
		t.Fatalf("the agent acts as %s %v, want system:node:n1 in system:nodes", user.Username, user.Groups)
	}
	client, err := kubernetes.NewForConfig(id.Config())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Secrets("kube-system").List(t.Context(), metav1.ListOptions{}); err == nil {
		t.Error("the Node listed kube-system's Secrets")
	}
	first := signedCSRs()
	if len(first) != 1 || first[0].cn != "system:node:n1" || first[0].requester == "system:node:n1" {
		t.Fatalf("CSRs signed at the start: %+v, want one for system:node:n1 asked by the bootstrap user", first)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("certificate directory: %v, mode %v; want 0700", err, fi.Mode().Perm())
	}
	firstNotAfter := id.NotAfter()

	// The renewal: asked by the Node itself; the same client works on.
	err = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return id.NotAfter().After(firstNotAfter), nil
	})
	if err != nil {
		t.Fatalf("the certificate was not renewed before it expired at %v: %v", firstNotAfter, err)
	}
	all := signedCSRs()
	if len(all) < 2 || all[1].requester != "system:node:n1" || all[1].cn != "system:node:n1" {
		t.Fatalf("CSRs signed: %+v; want the renewal asked by system:node:n1", all)
	}
	if _, err := client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=n1"}); err != nil {
		t.Errorf("the client with the renewed certificate: %v", err)
	}
	cancel()

	// A new start finds the certificate and asks for none.
	before := len(signedCSRs())
	id2, err := nodeidentity.Start(t.Context(), nodeidentity.Options{NodeName: node, CertDir: dir, Bootstrap: bootstrapper(t, env)})
	if err != nil {
		t.Fatal(err)
	}
	if u := whoAmI(t, id2.Config()); u.Username != "system:node:n1" {
		t.Errorf("after a restart the agent acts as %s", u.Username)
	}
	if after := len(signedCSRs()); after != before {
		t.Errorf("a restart with a valid certificate asked for %d new ones", after-before)
	}
}

// TestStartRefusesAnotherNodesCertificate: a certificate directory that
// holds another Node's certificate (a root directory moved, --node-name
// changed) is refused, not used.
func TestStartRefusesAnotherNodesCertificate(t *testing.T) {
	env := nodeAPIServer(t)
	signer(t, env, time.Hour)
	dir := filepath.Join(t.TempDir(), "pki")
	ctx, cancel := context.WithCancel(t.Context())
	if _, err := nodeidentity.Start(ctx, nodeidentity.Options{NodeName: "a", CertDir: dir, Bootstrap: bootstrapper(t, env)}); err != nil {
		t.Fatal(err)
	}
	cancel()
	_, err := nodeidentity.Start(t.Context(), nodeidentity.Options{NodeName: "b", CertDir: dir, Bootstrap: bootstrapper(t, env)})
	if !errors.Is(err, nodeidentity.ErrOtherNode) {
		t.Fatalf("Start for node b over node a's certificate: %v, want ErrOtherNode", err)
	}
	t.Log(err)
}

// TestStartWaitsForApproval: without an approver the agent waits (and
// says so) until its context ends; it never goes on without a
// certificate.
func TestStartWaitsForApproval(t *testing.T) {
	env := nodeAPIServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	_, err := nodeidentity.Start(ctx, nodeidentity.Options{NodeName: "n", CertDir: t.TempDir(), Bootstrap: bootstrapper(t, env)})
	if err == nil {
		t.Fatal("Start returned without an approved certificate")
	}
	csrs, lerr := env.Client.CertificatesV1().CertificateSigningRequests().List(t.Context(), metav1.ListOptions{})
	if lerr != nil || len(csrs.Items) == 0 {
		t.Fatalf("no CSR was made: %v", lerr)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
