package csrapprover

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"sync"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// request describes a certificate request to generate.
type request struct {
	cn     string
	org    []string
	dns    []string
	ips    []net.IP
	emails []string
	uris   []*url.URL
	key    crypto.Signer
}

var (
	keysOnce             sync.Once
	ecKey, rsaKey, edKey crypto.Signer
)

// keys generates one key of each kind for all tests.
func keys(t *testing.T) {
	t.Helper()
	keysOnce.Do(func() {
		var err error
		if ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		if rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if _, edKey, err = ed25519.GenerateKey(rand.Reader); err != nil {
			panic(err)
		}
	})
}

// nodeRequest is a kubelet client request for system:node:<node> with an
// ECDSA key, as client-go's certificate manager makes it.
func nodeRequest(node string) request {
	return request{cn: "system:node:" + node, org: []string{"system:nodes"}}
}

// pemRequest generates r with crypto/x509 and returns it in PEM.
func pemRequest(t *testing.T, r request) []byte {
	t.Helper()
	keys(t)
	key := r.key
	if key == nil {
		key = ecKey
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: r.cn, Organization: r.org},
		DNSNames:       r.dns,
		IPAddresses:    r.ips,
		EmailAddresses: r.emails,
		URIs:           r.uris,
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// requester is who sends a request: what the API server records in its
// spec.
type requester struct {
	user   string
	groups []string
	extra  map[string]certificatesv1.ExtraValue
}

// agentPod is the default agent ServiceAccount with a token bound to pod
// on node.
func agentPod(node, pod string) requester {
	return requester{
		user:   "system:serviceaccount:csi-volmgr:csi-volmgr",
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:csi-volmgr", "system:authenticated"},
		extra: map[string]certificatesv1.ExtraValue{
			ExtraNodeName: {node},
			ExtraPodName:  {pod},
			"authentication.kubernetes.io/credential-id": {"JTI=1234"},
		},
	}
}

// nodeUser is the Node name with its client certificate.
func nodeUser(name string) requester {
	return requester{user: "system:node:" + name, groups: []string{"system:nodes", "system:authenticated"}}
}

// bootstrapToken is the bootstrap token id with extra groups.
func bootstrapToken(id string, groups ...string) requester {
	return requester{user: "system:bootstrap:" + id, groups: append([]string{"system:bootstrappers", "system:authenticated"}, groups...)}
}

// ecUsages are the usages client-go's certificate manager asks for
// with an ECDSA key.
var ecUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}

// newCSR is a pending request of SignerName by who.
func newCSR(t *testing.T, name string, who requester, r request) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr := &certificatesv1.CertificateSigningRequest{
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: SignerName,
			Request:    pemRequest(t, r),
			Usages:     ecUsages,
			Username:   who.user,
			Groups:     who.groups,
			Extra:      who.extra,
		},
	}
	csr.Name = name
	return csr
}
