//go:build drivers

package certmanager_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var crGVR = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificaterequests"}

// signer approves and signs the CertificateRequests of every namespace with a CA of its own, as
// cert-manager's approver and a CA issuer would: the csi-driver only waits for the request's
// Approved and Ready conditions and its status.certificate.
type signer struct {
	dyn      dynamic.Interface
	lifetime time.Duration
	ca       *x509.Certificate
	caKey    crypto.Signer
	caPEM    []byte
	// issued counts the certificates signed.
	issued atomic.Int32
	// lastErr is the last error of a pass, for the test's messages.
	lastErr atomic.Value
}

func newSigner(t *testing.T, dyn dynamic.Interface, lifetime time.Duration) *signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "csi-volmgr driver matrix CA"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{dyn: dyn, lifetime: lifetime, ca: ca, caKey: key,
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// run approves and signs until ctx ends.
func (s *signer) run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := s.pass(ctx); err != nil && ctx.Err() == nil {
			s.lastErr.Store(err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *signer) pass(ctx context.Context) error {
	list, err := s.dyn.Resource(crGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		if err := s.handle(ctx, &list.Items[i]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", list.Items[i].GetName(), err))
		}
	}
	return errors.Join(errs...)
}

func condition(u *unstructured.Unstructured, typ string) (status string, ok bool) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			s, _ := m["status"].(string)
			return s, true
		}
	}
	return "", false
}

func addCondition(u *unstructured.Unstructured, typ, reason, message string) error {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	conds = append(conds, map[string]any{"type": typ, "status": "True", "reason": reason, "message": message,
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339)})
	return unstructured.SetNestedSlice(u.Object, conds, "status", "conditions")
}

func (s *signer) handle(ctx context.Context, u *unstructured.Unstructured) error {
	if _, denied := condition(u, "Denied"); denied {
		return nil
	}
	if _, approved := condition(u, "Approved"); !approved {
		if err := addCondition(u, "Approved", "csi-volmgr-e2e", "approved by the driver matrix's signer"); err != nil {
			return err
		}
		_, err := s.dyn.Resource(crGVR).Namespace(u.GetNamespace()).UpdateStatus(ctx, u, metav1.UpdateOptions{})
		return err
	}
	if _, ready := condition(u, "Ready"); ready {
		return nil
	}
	req, _, _ := unstructured.NestedString(u.Object, "spec", "request")
	csrPEM, err := base64.StdEncoding.DecodeString(req)
	if err != nil {
		return fmt.Errorf("spec.request: %w", err)
	}
	block, _ := pem.Decode(csrPEM)
	if block == nil {
		return errors.New("spec.request holds no PEM block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return err
	}
	if err := csr.CheckSignature(); err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: csr.Subject, DNSNames: csr.DNSNames, URIs: csr.URIs, IPAddresses: csr.IPAddresses,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(s.lifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, csr.PublicKey, s.caKey)
	if err != nil {
		return err
	}
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := unstructured.SetNestedField(u.Object, base64.StdEncoding.EncodeToString(cert), "status", "certificate"); err != nil {
		return err
	}
	if err := unstructured.SetNestedField(u.Object, base64.StdEncoding.EncodeToString(s.caPEM), "status", "ca"); err != nil {
		return err
	}
	if err := addCondition(u, "Ready", "Issued", "signed by the driver matrix's CA"); err != nil {
		return err
	}
	if _, err := s.dyn.Resource(crGVR).Namespace(u.GetNamespace()).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return err
	}
	s.issued.Add(1)
	return nil
}

// verify checks that certPEM is a certificate of the signer for dnsName whose key is keyPEM's,
// and returns it.
func (s *signer) verify(certPEM, keyPEM []byte, dnsName string) (*x509.Certificate, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return nil, errors.New("tls.crt holds no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(s.ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: dnsName}); err != nil {
		return nil, fmt.Errorf("tls.crt does not verify against the CA for %s: %w", dnsName, err)
	}
	kblock, _ := pem.Decode(keyPEM)
	if kblock == nil {
		return nil, errors.New("tls.key holds no PEM block")
	}
	key, err := parseKey(kblock.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("tls.key is not the key of tls.crt")
	}
	return cert, nil
}

func parseKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParsePKCS8PrivateKey(der); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
	}
	if k, err := x509.ParseECPrivateKey(der); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	return nil, errors.New("tls.key: not a PKCS#8, EC or PKCS#1 private key")
}
