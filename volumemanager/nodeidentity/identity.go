// Package nodeidentity gives the agent the identity of its Node on the API
// server, as a kubelet has it: user system:node:<Node name> in group
// system:nodes, authenticated by a client certificate that the agent asks
// for with a CertificateSigningRequest (signer
// kubernetes.io/kube-apiserver-client-kubelet) made with its bootstrap
// credentials, keeps in its certificate directory and renews before it
// expires. Under that identity the API server's Node authorizer and
// NodeRestriction admission hold the agent to its own Node's objects: the
// Secrets, claims, volumes, attachments and tokens of the pods bound to it,
// its Node, Lease and CSINode.
//
// It is the kubelet's own client certificate manager
// (k8s.io/kubernetes/pkg/kubelet/certificate: NewKubeletClientCertificateManager,
// UpdateTransport) built from client-go's util/certificate: the first
// certificate is requested with the bootstrap credentials, every later one
// with the current certificate, so a renewal's requester is the Node
// itself.
package nodeidentity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/certificate"
	"k8s.io/client-go/util/connrotation"
	"k8s.io/klog/v2"
)

const (
	// UserPrefix is the Node authorizer's: a user system:node:<name> in
	// group Group is the kubelet of Node <name>.
	UserPrefix = "system:node:"
	// Group is the group every Node's user is in.
	Group = "system:nodes"

	// pairPrefix names the files of the certificate directory:
	// csi-volmgr-client-<timestamp>.pem (certificate and key) and the link
	// csi-volmgr-client-current.pem to the one in use.
	pairPrefix = "csi-volmgr-client"

	// certCheckPeriod is how often the transport looks for a rotated
	// certificate, to close the connections opened with the previous one
	// (the kubelet checks every second too).
	certCheckPeriod = time.Second
	// waitLogPeriod is how often the wait for the first certificate says
	// that it is still waiting.
	waitLogPeriod = 30 * time.Second
)

// UserName is the Node's user on the API server.
func UserName(node string) string { return UserPrefix + node }

// Options say whose certificate to get, where to keep it and with which
// credentials to ask for the first one.
type Options struct {
	// NodeName is the Node the agent serves: the certificate is for
	// system:node:<NodeName>.
	NodeName string
	// CertDir holds the key and certificate (mode 0700, created if
	// missing). It must survive restarts: a new start reuses the
	// certificate it finds there.
	CertDir string
	// Bootstrap has the API server's address and CA, and credentials that
	// may create a CertificateSigningRequest and read it back (the
	// built-in ClusterRole system:node-bootstrapper): a pod's ServiceAccount
	// token or a bootstrap token. They are used only while no valid
	// certificate is at hand; everything else, renewals included, goes
	// with the Node's own certificate.
	Bootstrap *rest.Config
	// Lifetime, when set, is the lifetime asked for
	// (spec.expirationSeconds); the signer may shorten it. Zero leaves it
	// to the signer (kube-controller-manager: a year by default).
	Lifetime time.Duration
}

// Identity is the Node's certificate, kept current in the background.
type Identity struct {
	node    string
	manager certificate.Manager
	// config authenticates with the current certificate only.
	config *rest.Config
	dialer *connrotation.Dialer
}

// ErrOtherNode says that the certificate directory holds the certificate
// of another Node.
var ErrOtherNode = errors.New("the certificate directory holds another Node's certificate")

// Start loads the Node's certificate from the certificate directory, or
// asks for one with the bootstrap credentials and waits until it is
// approved and issued (or ctx ends), and keeps it current until ctx ends:
// it is renewed, with the current certificate as the requester, once
// 70–90 % of its lifetime has passed. The returned Identity's Config is
// what every client of the agent uses.
func Start(ctx context.Context, opts Options) (*Identity, error) {
	if opts.NodeName == "" || opts.CertDir == "" || opts.Bootstrap == nil {
		return nil, errors.New("nodeidentity: NodeName, CertDir and Bootstrap are required")
	}
	logger := klog.FromContext(ctx).WithName("node-identity")
	if err := os.MkdirAll(opts.CertDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the certificate directory: %w", err)
	}
	store, err := certificate.NewFileStore(pairPrefix, opts.CertDir, opts.CertDir, "", "")
	if err != nil {
		return nil, fmt.Errorf("opening the certificate directory %s: %w", opts.CertDir, err)
	}
	user := UserName(opts.NodeName)
	if err := checkStored(store, user); err != nil {
		return nil, err
	}

	id := &Identity{node: opts.NodeName}
	// Everything but the credentials of the bootstrap configuration: the
	// server, its CA, TLS server name, proxy, user agent, rates.
	base := rest.CopyConfig(opts.Bootstrap)
	clientsetFn := func(current *tls.Certificate) (kubernetes.Interface, error) {
		if current != nil && current.Leaf != nil && time.Now().Before(current.Leaf.NotAfter) {
			cfg := rest.AnonymousClientConfig(base)
			certPEM, keyPEM, err := pemPair(store)
			if err != nil {
				return nil, err
			}
			cfg.CertData, cfg.KeyData = certPEM, keyPEM
			return kubernetes.NewForConfig(cfg)
		}
		return kubernetes.NewForConfig(base)
	}
	var lifetime *time.Duration
	if opts.Lifetime > 0 {
		lifetime = &opts.Lifetime
	}
	mctx := klog.NewContext(ctx, logger)
	id.manager, err = certificate.NewManager(&certificate.Config{
		ClientsetFn: clientsetFn,
		Template: &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: user, Organization: []string{Group}},
		},
		SignerName:                   certificatesv1.KubeAPIServerClientKubeletSignerName,
		RequestedCertificateLifetime: lifetime,
		GetUsages:                    certificate.DefaultKubeletClientGetUsages,
		CertificateStore:             store,
		Name:                         "client",
		Ctx:                          &mctx,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the certificate manager: %w", err)
	}
	id.manager.Start()

	if err := waitForCertificate(ctx, logger, id.manager, user); err != nil {
		id.manager.Stop()
		return nil, err
	}
	id.config, id.dialer, err = certificateConfig(base, id.manager)
	if err != nil {
		id.manager.Stop()
		return nil, err
	}
	go id.closeOnRotation(ctx)
	cert := id.manager.Current()
	logger.Info("Acting on the API server as the Node", "user", user, "certificate", store.CurrentPath(),
		"notAfter", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return id, nil
}

// Config returns a copy of the configuration that authenticates as the
// Node with its current certificate, and nothing else: add rates, content
// types and the user agent to it.
func (id *Identity) Config() *rest.Config { return rest.CopyConfig(id.config) }

// User is the Node's user name, system:node:<name>.
func (id *Identity) User() string { return UserName(id.node) }

// NotAfter is when the current certificate expires.
func (id *Identity) NotAfter() time.Time {
	if c := id.manager.Current(); c != nil && c.Leaf != nil {
		return c.Leaf.NotAfter
	}
	return time.Time{}
}

// checkStored refuses a certificate directory whose current certificate
// is for another user: its records belong to another Node, and acting as
// that Node would touch that Node's objects.
func checkStored(store certificate.Store, user string) error {
	cert, err := store.Current()
	if err != nil {
		var noCert *certificate.NoCertKeyError
		if errors.As(err, &noCert) {
			return nil
		}
		return fmt.Errorf("reading the certificate directory: %w", err)
	}
	if cert.Leaf != nil && cert.Leaf.Subject.CommonName != user {
		return fmt.Errorf("%w: it is for %s, this agent serves %s; remove it to ask for this Node's certificate: %s",
			ErrOtherNode, cert.Leaf.Subject.CommonName, user, currentPath(store))
	}
	return nil
}

func currentPath(store certificate.Store) string {
	if fs, ok := store.(interface{ CurrentPath() string }); ok {
		return fs.CurrentPath()
	}
	return "(unknown)"
}

// pemPair reads the current certificate and key back from the store's
// file (one PEM file holds both).
func pemPair(store certificate.Store) (certPEM, keyPEM []byte, err error) {
	path := currentPath(store)
	data, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the Node's certificate: %w", err)
	}
	return data, data, nil
}

// waitForCertificate waits until the manager has a certificate, saying
// every waitLogPeriod what it waits for.
func waitForCertificate(ctx context.Context, logger klog.Logger, m certificate.Manager, user string) error {
	if m.Current() != nil {
		return nil
	}
	logger.Info("Asking for the Node's client certificate with the bootstrap credentials; waiting until it is approved and issued",
		"user", user, "signer", certificatesv1.KubeAPIServerClientKubeletSignerName)
	began := time.Now()
	lastLog := began
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		if m.Current() != nil {
			return true, nil
		}
		if time.Since(lastLog) >= waitLogPeriod {
			lastLog = time.Now()
			logger.Info("Still waiting for the Node's client certificate: is csi-volmgr's CSR approver running, and may the bootstrap credentials create CertificateSigningRequests?",
				"user", user, "waited", time.Since(began).Round(time.Second))
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("no client certificate for %s after %v: %w", user, time.Since(began).Round(time.Second), err)
	}
	return nil
}

// certificateConfig is base without its credentials, authenticating with
// the manager's current certificate at every TLS handshake, over a dialer
// whose connections closeOnRotation closes once the certificate changed
// (the kubelet's UpdateTransport).
func certificateConfig(base *rest.Config, m certificate.Manager) (*rest.Config, *connrotation.Dialer, error) {
	cfg := rest.AnonymousClientConfig(base)
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("the API server's TLS configuration: %w", err)
	}
	if tlsConfig == nil {
		return nil, nil, fmt.Errorf("the API server %s is not reached over TLS: a client certificate cannot be used", base.Host)
	}
	tlsConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if cert := m.Current(); cert != nil {
			return cert, nil
		}
		// No certificate (expired, renewal pending): the API server sees
		// an anonymous client and refuses what a Node may do.
		return &tls.Certificate{}, nil
	}
	dial := base.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	d := connrotation.NewDialer(dial)
	cfg.Transport = utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     tlsConfig,
		MaxIdleConnsPerHost: 25,
		DialContext:         d.DialContext,
	})
	// The transport enforces them now; a config with both is refused.
	cfg.TLSClientConfig = rest.TLSClientConfig{}
	cfg.Dial = nil
	return cfg, d, nil
}

// closeOnRotation closes the connections made with a previous certificate
// once the manager holds a new one, so that no request goes on with a
// certificate that was replaced (a long watch would otherwise keep it to
// its end).
func (id *Identity) closeOnRotation(ctx context.Context) {
	var (
		mu   sync.Mutex
		last = id.manager.Current()
	)
	logger := klog.FromContext(ctx).WithName("node-identity")
	wait.UntilWithContext(ctx, func(context.Context) {
		mu.Lock()
		defer mu.Unlock()
		cur := id.manager.Current()
		if cur == nil || cur == last || (last != nil && cur.Leaf != nil && last.Leaf != nil && cur.Leaf.Equal(last.Leaf)) {
			return
		}
		last = cur
		logger.Info("The Node's client certificate was renewed; closing the connections made with the previous one",
			"notAfter", cur.Leaf.NotAfter.UTC().Format(time.RFC3339))
		id.dialer.CloseAll()
	}, certCheckPeriod)
	id.manager.Stop()
}

// IsNodeUser says whether user is a Node's user, and which.
func IsNodeUser(user string) (node string, ok bool) {
	return strings.CutPrefix(user, UserPrefix)
}

// SignerName is the signer of the Node's client certificates, a kubelet's.
const SignerName = certificatesv1.KubeAPIServerClientKubeletSignerName
