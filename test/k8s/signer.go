package k8stest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// clientCAFile is where envtest's client-certificate authenticator writes
// the CA kube-apiserver's --client-ca-file names (controller-runtime
// pkg/internal/testing/controlplane/auth.go, CertAuthn.caCrtPath).
const clientCAFile = "client-cert-auth-ca.crt"

// signerTrustTimeout bounds the wait until kube-apiserver, which reloads
// --client-ca-file when it changes, accepts the signer's certificates.
const signerTrustTimeout = 60 * time.Second

// Signer is a client CA that the API server trusts besides envtest's own,
// whose key the test holds: what kube-controller-manager's csrsigning
// controller signs kubelet client certificates with
// (--cluster-signing-kube-apiserver-client-kubelet-cert-file and -key-file
// name CertFile and KeyFile), and what a test uses to hand an agent a
// system:node:<name> certificate without running the controller-manager.
type Signer struct {
	// CertFile and KeyFile hold the CA's certificate and its private key
	// (PEM).
	CertFile, KeyFile string

	cert *x509.Certificate
	key  crypto.Signer
}

// newSigner makes a CA in dir.
func newSigner(dir string) (*Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the signer's key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		Subject:               pkix.Name{CommonName: "k8stest-kubelet-client-signer"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signing the signer: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	s := &Signer{CertFile: filepath.Join(dir, "signer.crt"), KeyFile: filepath.Join(dir, "signer.key"), cert: cert, key: key}
	if err := os.WriteFile(s.CertFile, s.CertPEM(), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(s.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	return s, nil
}

// CertPEM is the CA's certificate.
func (s *Signer) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.cert.Raw})
}

// ClientCert issues a client certificate for user name in groups, valid
// for validity from now, and returns it and its new key (PEM).
func (s *Signer) ClientCert(name string, validity time.Duration, groups ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: name, Organization: groups},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.cert, key.Public(), s.key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing a certificate for %s: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// NodeConfig returns a config that authenticates as the kubelet of node
// name (system:node:<name> in system:nodes) with a certificate from the
// Env's Signer: what the Node authorizer and NodeRestriction hold to that
// node. It fails without Options.NodeClientSigner.
func (e *Env) NodeConfig(name string) (*rest.Config, error) {
	if e.Signer == nil {
		return nil, errors.New("the environment was started without Options.NodeClientSigner")
	}
	certPEM, keyPEM, err := e.Signer.ClientCert("system:node:"+name, 24*time.Hour, "system:nodes")
	if err != nil {
		return nil, err
	}
	return CertConfig(e.Config, certPEM, keyPEM), nil
}

// CertConfig is base (its server and CA) authenticating with the client
// certificate certPEM and its key keyPEM only.
func CertConfig(base *rest.Config, certPEM, keyPEM []byte) *rest.Config {
	cfg := rest.AnonymousClientConfig(base)
	cfg.CertData, cfg.KeyData = certPEM, keyPEM
	return cfg
}

// trustSigner adds the signer's CA to the API server's client CA file,
// which kube-apiserver reloads when it changes, and waits until a
// certificate of the signer authenticates.
func (e *Env) trustSigner() error {
	path := filepath.Join(e.certDir, clientCAFile)
	ca, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the API server's client CA: %w", err)
	}
	bundle := append(append(ca, '\n'), e.Signer.CertPEM()...)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, bundle, 0o640); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	certPEM, keyPEM, err := e.Signer.ClientCert("k8stest:signer-probe", time.Hour)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(CertConfig(e.Config, certPEM, keyPEM))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), signerTrustTimeout)
	defer cancel()
	var last error
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, last = client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if last != nil && !apierrors.IsUnauthorized(last) {
			return false, nil
		}
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver did not accept the signer's certificates within %v (last: %w): %w", signerTrustTimeout, last, err)
	}
	return nil
}

// SignRequest issues the client certificate that the PEM certificate
// request csrPEM asks for (its subject, its public key), valid for
// validity from now: what kube-controller-manager's csrsigning controller
// issues for an approved kubelet client CSR.
func (s *Signer) SignRequest(csrPEM []byte, validity time.Duration) ([]byte, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("not a PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	if err := req.CheckSignature(); err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      req.Subject,
		NotBefore:    now.Add(-time.Second),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.cert, req.PublicKey, s.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
