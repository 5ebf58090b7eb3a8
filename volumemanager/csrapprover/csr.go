package csrapprover

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/user"
)

// The usages a kubelet client request may have: client auth and digital
// signature, key encipherment too (an RSA key), as kube-controller-manager's
// signer for SignerName checks them (k8s.io/kubernetes
// pkg/apis/certificates ValidateKubeletClientCSR) and client-go's
// certificate manager asks for them.
var (
	clientUsages    = sets.New(certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth)
	clientUsagesRSA = sets.New(certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment,
		certificatesv1.UsageClientAuth)
)

// kubeletClientNode checks that request (PEM) and usages make a kubelet
// client certificate request, as kube-controller-manager's signer checks
// it, with an ECDSA or RSA key and a valid signature, and returns the Node
// it asks for (the common name after system:node:). The Node is returned
// with the error when the common name names one.
func kubeletClientNode(request []byte, usages []certificatesv1.KeyUsage) (string, error) {
	block, _ := pem.Decode(request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "", errors.New("no PEM block CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", err
	}
	node, named := strings.CutPrefix(req.Subject.CommonName, nodeUserPrefix)
	if !named {
		return "", fmt.Errorf("subject common name %q does not start with %s", req.Subject.CommonName, nodeUserPrefix)
	}
	if msgs := validation.IsDNS1123Subdomain(node); len(msgs) > 0 {
		return "", fmt.Errorf("subject common name %q names no valid Node: %s", req.Subject.CommonName, strings.Join(msgs, ", "))
	}
	switch {
	case !slices.Equal(req.Subject.Organization, []string{user.NodesGroup}):
		return node, fmt.Errorf("subject organization %q is not exactly [%s]", req.Subject.Organization, user.NodesGroup)
	case len(req.DNSNames) > 0:
		return node, fmt.Errorf("DNS subjectAltNames %q are not allowed", req.DNSNames)
	case len(req.IPAddresses) > 0:
		return node, fmt.Errorf("IP subjectAltNames %q are not allowed", req.IPAddresses)
	case len(req.EmailAddresses) > 0:
		return node, fmt.Errorf("email subjectAltNames %q are not allowed", req.EmailAddresses)
	case len(req.URIs) > 0:
		return node, fmt.Errorf("URI subjectAltNames %q are not allowed", req.URIs)
	}
	if got := sets.New(usages...); !got.Equal(clientUsages) && !got.Equal(clientUsagesRSA) {
		return node, fmt.Errorf("usages %q are not %q or %q", sets.List(got), sets.List(clientUsages), sets.List(clientUsagesRSA))
	}
	switch req.PublicKeyAlgorithm {
	case x509.ECDSA, x509.RSA:
	default:
		return node, fmt.Errorf("key algorithm %s is not ECDSA or RSA", req.PublicKeyAlgorithm)
	}
	if err := req.CheckSignature(); err != nil {
		return node, fmt.Errorf("signature: %w", err)
	}
	return node, nil
}
