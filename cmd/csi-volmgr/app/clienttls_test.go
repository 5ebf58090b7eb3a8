package app

import (
	"crypto/tls"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	certutil "k8s.io/client-go/util/cert"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// TestStatusVerifiesTheServer: an https:// --server (or one without a
// scheme) is verified with --certificate-authority and refused without it;
// --insecure-skip-tls-verify skips the check only when given; the token
// and the client certificate of --client-certificate go along.
func TestStatusVerifiesTheServer(t *testing.T) {
	agent := &fakeAgent{}
	var mu sync.Mutex
	var clientNames []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		name := ""
		if len(r.TLS.PeerCertificates) > 0 {
			name = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		clientNames = append(clientNames, name)
		mu.Unlock()
		agent.ServeHTTP(w, r)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("alice", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "alice.crt"), filepath.Join(dir, "alice.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}

	if _, err := runStatus(t, "--server", srv.URL, "--token", "t1"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("status against an unknown certificate = %v, want a verification error", err)
	}
	if _, err := runStatus(t, "--server", srv.URL, "--token", "t2", "--certificate-authority", caFile); err != nil {
		t.Errorf("status --certificate-authority: %v", err)
	}
	if _, err := runStatus(t, "--server", strings.TrimPrefix(srv.URL, "https://"), "--certificate-authority", caFile,
		"--client-certificate", certFile, "--client-key", keyFile); err != nil {
		t.Errorf("status without a scheme, with a client certificate: %v", err)
	}
	if _, err := runStatus(t, "--server", srv.URL, "--token", "t4", "--insecure-skip-tls-verify"); err != nil {
		t.Errorf("status --insecure-skip-tls-verify: %v", err)
	}
	if got, want := strings.Join(agent.authorizations(), "|"), "Bearer t2||Bearer t4"; got != want {
		t.Errorf("Authorization headers %q, want %q (nothing sent to the unverified server)", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(clientNames) != 3 || clientNames[0] != "" || !strings.HasPrefix(clientNames[1], "alice@") || clientNames[2] != "" {
		t.Errorf("client certificates %q, want alice's on the second request alone", clientNames)
	}
}

// TestStatusKeepsTokensOffPlainHTTP: a token is never sent over http://
// to an address other than a loopback one; the error says why, and no
// request is made.
func TestStatusKeepsTokensOffPlainHTTP(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--server", "http://192.0.2.1:9809", "--token", "secret"},
		{"--server", "http://agent.example.com:9809", "--token-file", tokenFile},
		{"--server", "http://[2001:db8::1]:9809", "--token", "secret"},
	} {
		_, err := runStatus(t, args...)
		if err == nil || !strings.Contains(err.Error(), "refusing to send the bearer token over plain HTTP") {
			t.Errorf("status %v = %v, want a refusal to send the token", args, err)
		}
	}
}

// TestHTTPAccessDefaults: the configuration's defaults of the TCP
// endpoint's access are apiauth's, and TLS 1.2 at least.
func TestHTTPAccessDefaults(t *testing.T) {
	o := NewRunOptions()
	access, err := o.httpAccess()
	if err != nil {
		t.Fatal(err)
	}
	if access.Plaintext || access.MinVersion != tls.VersionTLS12 || len(access.CipherSuites) != 0 ||
		len(access.APIAudiences) != 1 || access.APIAudiences[0] != apiauth.DefaultAPIAudience ||
		access.AuthenticationCacheTTL != apiauth.DefaultAuthenticationCacheTTL ||
		access.AllowCacheTTL != apiauth.DefaultAllowCacheTTL || access.DenyCacheTTL != apiauth.DefaultDenyCacheTTL {
		t.Errorf("default HTTPAccess %+v, want TLS 1.2, audience %s and apiauth's cache lifetimes", access, apiauth.DefaultAPIAudience)
	}
	o.TLSMinVersion, o.TLSCipherSuites = "VersionTLS9", []string{"TLS_NO_SUCH"}
	if _, err := o.httpAccess(); err == nil || !strings.Contains(err.Error(), "--tls-min-version") || !strings.Contains(err.Error(), "--tls-cipher-suites") {
		t.Errorf("httpAccess with a bad version and suite = %v, want errors naming both flags", err)
	}
}
