package volumemanager_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/servingcert"
)

// TestTCPEndpointCredentials runs the agent on every interface (not the
// loopback: TLS, and /metrics guarded) against a real API server, with a
// client CA, and checks what each credential gets:
//   - a token for the API server's own audience: 401, though its
//     ServiceAccount has the grant (the agent reviews tokens for the
//     audience csi-volmgr only);
//   - a token of that ServiceAccount for csi-volmgr: 200, and the API
//     server itself refuses it (401), so it cannot be replayed there;
//   - a client certificate of the client CA whose user has the grant: 200;
//     of a user without it: 403; of another CA: 401;
//   - /metrics: 401 without credentials, 403 with the runtime API's grant
//     alone, 200 with get on nodes/metrics; /healthz stays open.
func TestTCPEndpointCredentials(t *testing.T) {
	f := k8stest.New(t)
	f.CreateNode(t)
	ca, otherCA := newTestCA(t, "client-ca"), newTestCA(t, "other-ca")
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, ca.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(freeAddress(t))
	if err != nil {
		t.Fatal(err)
	}
	var root string
	startClusterNode(t, f, func(c *volumemanager.Config) {
		c.HTTPEndpoint, c.HTTPAccess.ClientCAFile = ":"+port, caFile
		root = c.RootDir
	})
	url := "https://127.0.0.1:" + port
	roots := selfSignedCA(t, root)
	anonymous := tlsClient(t, roots)

	apiToken := func() string { // before the grant: the agent would cache a denial
		serviceAccountToken(t, f, "runtime")
		return tokenFor(t, f, "runtime")
	}()
	bindRole(t, f, "runtime", apiReaderRole, "get")
	agentToken := tokenFor(t, f, "runtime", "csi-volmgr")
	for _, tc := range []struct {
		who, token string
		want       int
	}{{"a token for the API server's audience", apiToken, http.StatusUnauthorized}, {"a token for csi-volmgr", agentToken, http.StatusOK}} {
		if code := call(t, anonymous, http.MethodGet, url+volumemanager.PodsPath, tc.token); code != tc.want {
			t.Errorf("GET %s with %s answered %d, want %d", volumemanager.PodsPath, tc.who, code, tc.want)
		}
	}
	// The point of the audience: the API server refuses the agent's token.
	asAgentToken := rest.AnonymousClientConfig(f.Config)
	asAgentToken.BearerToken = agentToken
	if _, err := kubernetes.NewForConfigOrDie(asAgentToken).CoreV1().Namespaces().Get(t.Context(), f.Namespace, metav1.GetOptions{}); !apierrors.IsUnauthorized(err) {
		t.Errorf("GET a namespace from the API server with the csi-volmgr token: %v, want 401", err)
	}

	// Client certificates: authenticated by the CA, authorized by the API
	// server for their common name.
	grant(t, f, "alice-"+f.Namespace, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/csi-volmgr"}, Verbs: []string{"get"}},
		rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice-" + f.Namespace}, "csi-volmgr")
	for _, tc := range []struct {
		who  string
		cert tls.Certificate
		want int
	}{
		{"a certificate of the client CA with the grant", ca.issue(t, "alice-"+f.Namespace), http.StatusOK},
		{"a certificate of the client CA without the grant", ca.issue(t, "mallory-"+f.Namespace), http.StatusForbidden},
		{"a certificate of another CA", otherCA.issue(t, "alice-"+f.Namespace), http.StatusUnauthorized},
	} {
		client := tlsClient(t, roots, tc.cert)
		if code := call(t, client, http.MethodGet, url+volumemanager.PodsPath, ""); code != tc.want {
			t.Errorf("GET %s with %s answered %d, want %d", volumemanager.PodsPath, tc.who, code, tc.want)
		}
	}

	// Off the loopback, /metrics needs get on nodes/metrics.
	serviceAccountToken(t, f, "prometheus")
	grant(t, f, "prometheus-"+f.Namespace, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/metrics"}, Verbs: []string{"get"}},
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: f.Namespace, Name: "prometheus"}, "metrics")
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"the runtime API's grant alone", agentToken, http.StatusForbidden},
		{"get on nodes/metrics", tokenFor(t, f, "prometheus", "csi-volmgr"), http.StatusOK},
	} {
		if code := call(t, anonymous, http.MethodGet, url+"/metrics", tc.token); code != tc.want {
			t.Errorf("GET /metrics off the loopback with %s answered %d, want %d", tc.who, code, tc.want)
		}
	}
	if code := call(t, anonymous, http.MethodGet, url+"/healthz", ""); code != http.StatusOK {
		t.Errorf("GET /healthz off the loopback answered %d, want 200", code)
	}
}

// TestTCPEndpointServesTLS: by default the TCP endpoint serves a
// self-signed certificate from <root>/pki (key 0600) that verifies for
// the loopback address, refuses plain HTTP and TLS below 1.2; with
// --tls-cert-file it serves that certificate, and the new one once the
// files change on disk.
func TestTCPEndpointServesTLS(t *testing.T) {
	n := startStandaloneWith(t, func(c *volumemanager.Config) { c.HTTPEndpoint = freeAddress(t) })
	url := "https://" + n.httpEndpoint
	if code := call(t, tlsClient(t, selfSignedCA(t, n.root)), http.MethodGet, url+"/healthz", ""); code != http.StatusOK {
		t.Errorf("GET /healthz over TLS answered %d, want 200", code)
	}
	if fi, err := os.Stat(filepath.Join(n.root, "pki", servingcert.KeyFileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the self-signed key: %v, %v; want mode 0600", err, fi)
	}
	if code := call(t, http.DefaultClient, http.MethodGet, "http://"+n.httpEndpoint+"/healthz", ""); code != http.StatusBadRequest {
		t.Errorf("GET /healthz in plain HTTP answered %d, want 400 (an HTTP request to an HTTPS server)", code)
	}
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: selfSignedCA(t, n.root), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11, //nolint:gosec // the version refused
	}}}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/healthz", nil)
	if resp, err := old.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Errorf("GET /healthz over TLS 1.1 answered %d, want a failed handshake", resp.StatusCode)
	}

	// A certificate given: served, and followed on disk.
	ca := newTestCA(t, "serving-ca")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ca.writeServing(t, certFile, keyFile, "first")
	given := startStandaloneWith(t, func(c *volumemanager.Config) {
		c.HTTPEndpoint, c.HTTPAccess.CertFile, c.HTTPAccess.KeyFile = freeAddress(t), certFile, keyFile
	})
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	if got := servedCommonName(t, given.httpEndpoint, pool); got != "first" {
		t.Fatalf("served certificate %q, want the given one", got)
	}
	if _, err := os.Stat(filepath.Join(given.root, "pki", servingcert.CertFileName)); err == nil {
		t.Error("a self-signed certificate was written though one was given")
	}
	ca.writeServing(t, certFile, keyFile, "second")
	poll(t, "the new certificate to be served", func(context.Context) (bool, error) {
		return servedCommonName(t, given.httpEndpoint, pool) == "second", nil
	})
}

// TestSelfSignedCertificateRenewedUnderTheRunningAgent: the self-signed
// pair removed under a running agent is made again within a day by its
// renewer (servingcert.Renewer, which also renews it before it expires),
// and the new certificate is served without a restart.
func TestSelfSignedCertificateRenewedUnderTheRunningAgent(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	n := startStandaloneWith(t, func(c *volumemanager.Config) {
		c.HTTPEndpoint = freeAddress(t)
		volumemanager.SetServingCertClock(c, clk)
	})
	first := servedCertificate(t, n.httpEndpoint, selfSignedCA(t, n.root))
	poll(t, "the renewer to wait on its clock", func(context.Context) (bool, error) { return clk.HasWaiters(), nil })
	for _, f := range []string{servingcert.CertFileName, servingcert.KeyFileName} {
		if err := os.Remove(filepath.Join(n.root, "pki", f)); err != nil {
			t.Fatal(err)
		}
	}
	clk.Step(24 * time.Hour)
	poll(t, "a new self-signed certificate written and served", func(context.Context) (bool, error) {
		data, err := os.ReadFile(filepath.Join(n.root, "pki", servingcert.CertFileName))
		if err != nil {
			return false, nil
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return false, nil
		}
		c, err := tls.Dial("tcp", n.httpEndpoint, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
		if err != nil {
			return false, nil
		}
		defer c.Close()
		return !c.ConnectionState().PeerCertificates[0].Equal(first), nil
	})
}

// servedCertificate returns the certificate served at addr.
func servedCertificate(t *testing.T, addr string, roots *x509.CertPool) *x509.Certificate {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0]
}

// TestTCPEndpointRefusesPlaintextOffLoopback: plain HTTP on every
// interface is a ConfigError of HTTPAccess.Plaintext, and nothing listens.
func TestTCPEndpointRefusesPlaintextOffLoopback(t *testing.T) {
	_, port, _ := net.SplitHostPort(freeAddress(t))
	root := t.TempDir()
	_, err := volumemanager.New(t.Context(), volumemanager.Config{
		NodeName: "n", RootDir: root, Manifests: t.TempDir(),
		HTTPEndpoint: ":" + port, HTTPAccess: volumemanager.HTTPAccessConfig{Plaintext: true},
	})
	ce, ok := errors.AsType[*volumemanager.ConfigError](err)
	if !ok || ce.Field != "HTTPAccess.Plaintext" {
		t.Fatalf("New with plain HTTP on :%s = %v, want a ConfigError of HTTPAccess.Plaintext", port, err)
	}
	if c, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
		_ = c.Close()
		t.Error("something listens on the refused endpoint")
	}
}

// servedCommonName returns the common name of the certificate served at
// addr, verified with roots.
func servedCommonName(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// selfSignedCA returns the pool of the agent's self-signed certificate in
// <root>/pki, as a client given it with --certificate-authority trusts.
func selfSignedCA(t *testing.T, root string) *x509.CertPool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "pki", servingcert.CertFileName))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		t.Fatal("no certificate in the agent's self-signed certificate file")
	}
	return pool
}

// tlsClient returns a client that trusts roots and presents certs.
func tlsClient(t *testing.T, roots *x509.CertPool, certs ...tls.Certificate) *http.Client {
	t.Helper()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// grant creates a ClusterRole of rule bound to subject, both named name,
// and waits until the API server allows it (the agent would cache a
// denial).
func grant(t *testing.T, f *k8stest.Fixture, name string, rule rbacv1.PolicyRule, subject rbacv1.Subject, subresource string) {
	t.Helper()
	ctx := t.Context()
	rbac := f.Client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{subject},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		_ = rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	user := subject.Name
	if subject.Kind == rbacv1.ServiceAccountKind {
		user = "system:serviceaccount:" + subject.Namespace + ":" + subject.Name
	}
	poll(t, "the API server to authorize "+user, func(ctx context.Context) (bool, error) {
		got, err := f.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Subresource: subresource, Name: f.NodeName},
		}}, metav1.CreateOptions{})
		return err == nil && got.Status.Allowed, nil
	})
}

// testCA is a CA that issues client and serving certificates in tests.
type testCA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// sign returns a certificate of a new key for cn, signed by the CA, and
// the PEM of both.
func (ca *testCA) sign(t *testing.T, cn string, usage x509.ExtKeyUsage, ips ...net.IP) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// issue returns a client certificate of the user cn.
func (ca *testCA) issue(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM := ca.sign(t, cn, x509.ExtKeyUsageClientAuth)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// writeServing writes a serving certificate for 127.0.0.1 whose common
// name is cn, and its key.
func (ca *testCA) writeServing(t *testing.T, certFile, keyFile, cn string) {
	t.Helper()
	certPEM, keyPEM := ca.sign(t, cn, x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	// The key first, then the certificate, each replaced at once: the
	// watcher may read between the two, and then again after.
	for _, w := range []struct {
		path string
		data []byte
	}{{keyFile, keyPEM}, {certFile, certPEM}} {
		tmp := w.path + ".tmp"
		if err := os.WriteFile(tmp, w.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, w.path); err != nil {
			t.Fatal(err)
		}
	}
}
