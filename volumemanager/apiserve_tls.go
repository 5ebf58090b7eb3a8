package volumemanager

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/servingcert"
)

// HTTPAccessConfig says how the TCP endpoint (Config.HTTPEndpoint) is
// secured, as the kubelet secures its port 10250: TLS with a serving
// certificate given or self-signed, client certificates of a client CA,
// bearer tokens of the agent's own audience, and how long their reviews
// are cached. The zero value serves TLS with a self-signed certificate and
// accepts tokens of the audience apiauth.DefaultAPIAudience.
type HTTPAccessConfig struct {
	// Plaintext serves plain HTTP instead of TLS; only on a loopback
	// HTTPEndpoint (127.0.0.1, ::1, localhost): anything else always
	// serves TLS, so that no token and no metrics cross a network in
	// cleartext.
	Plaintext bool
	// CertFile and KeyFile are the serving certificate (followed by its
	// intermediates) and its key, both or neither; they are read again
	// when they change on disk. Without them the agent serves a
	// self-signed certificate it keeps in CertDir (package servingcert),
	// for the host's names and addresses.
	CertFile, KeyFile string
	// CertDir holds the self-signed certificate; empty means
	// <RootDir>/pki.
	CertDir string
	// MinVersion is the lowest TLS version served, at least (and by
	// default) TLS 1.2.
	MinVersion uint16
	// CipherSuites are the TLS 1.2 cipher suites served; empty means Go's
	// defaults (TLS 1.3's are not configurable).
	CipherSuites []uint16
	// ClientCAFile, when set, is a CA bundle whose client certificates
	// authenticate as the user of their common name in the groups of
	// their organizations (read again when it changes on disk).
	ClientCAFile string
	// APIAudiences are the audiences a bearer token must be issued for
	// (one of them); empty means apiauth.DefaultAPIAudience.
	APIAudiences []string
	// AuthenticationCacheTTL, AllowCacheTTL and DenyCacheTTL are how long
	// a token's review and an allowed or a denied request's review are
	// cached; 0 means apiauth's defaults (the kubelet's: 2m, 5m, 30s).
	AuthenticationCacheTTL, AllowCacheTTL, DenyCacheTTL time.Duration
}

// IsLoopbackHost says whether host (an address or a name, without a port)
// is a loopback one: an address of 127.0.0.0/8 or ::1, or "localhost".
// An empty or unspecified host (every interface) is not.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// validate checks a with the endpoint it secures; cluster says there is
// an API server to authorize callers.
func (a *HTTPAccessConfig) validate(endpoint string, cluster bool) []error {
	var errs []error
	bad := func(field string, err error) {
		errs = append(errs, &ConfigError{Field: "HTTPAccess." + field, Err: err})
	}
	if a.Plaintext && endpoint != "" {
		if host, _, err := net.SplitHostPort(endpoint); err == nil && !IsLoopbackHost(host) {
			bad("Plaintext", fmt.Errorf("is only allowed on a loopback endpoint (127.0.0.1, ::1 or localhost), and %q is reachable from other hosts: there the endpoint always serves TLS", endpoint))
		}
		if a.CertFile != "" || a.KeyFile != "" || a.ClientCAFile != "" {
			bad("Plaintext", errors.New("cannot be used with a serving certificate or a client CA, which are for TLS"))
		}
	}
	if a.ClientCAFile != "" && !cluster {
		bad("ClientCAFile", errors.New("needs an API server (cluster mode) to authorize the certificates' users"))
	}
	if (a.CertFile == "") != (a.KeyFile == "") {
		if a.CertFile == "" {
			bad("CertFile", fmt.Errorf("is required with the private key %q", a.KeyFile))
		} else {
			bad("KeyFile", fmt.Errorf("is required with the certificate %q", a.CertFile))
		}
	}
	if a.MinVersion != 0 && a.MinVersion < tls.VersionTLS12 {
		bad("MinVersion", fmt.Errorf("%s is below TLS 1.2, the lowest the endpoint serves", tls.VersionName(a.MinVersion)))
	}
	for _, d := range []struct {
		field string
		ttl   time.Duration
	}{{"AuthenticationCacheTTL", a.AuthenticationCacheTTL}, {"AllowCacheTTL", a.AllowCacheTTL}, {"DenyCacheTTL", a.DenyCacheTTL}} {
		if d.ttl < 0 {
			bad(d.field, fmt.Errorf("%v must not be negative", d.ttl))
		}
	}
	return errs
}

// loopbackEndpoint says whether the TCP endpoint listens on a loopback
// address only; there /metrics is open, elsewhere it needs get on
// nodes/metrics.
func (vm *VolumeManager) loopbackEndpoint() bool {
	host, _, err := net.SplitHostPort(vm.cfg.HTTPEndpoint)
	return err == nil && IsLoopbackHost(host)
}

// tcpTLS is the TLS side of the TCP endpoint: its configuration, the
// client CA the guard verifies client certificates with, and the
// controllers that read the certificate and the CA again when they change.
type tcpTLS struct {
	config   *tls.Config
	clientCA *dynamiccertificates.DynamicFileCAContent
	cert     *dynamiccertificates.DynamicCertKeyPairContent
	ctrl     *dynamiccertificates.DynamicServingCertificateController
	// certFile, selfSigned and generated say which certificate is
	// served, for the log.
	certFile              string
	selfSigned, generated bool
	// renewer keeps the self-signed pair renewed; nil with a certificate
	// given.
	renewer *servingcert.Renewer
}

// newTCPTLS loads (or, without a certificate given, writes) the serving
// certificate and the client CA of the TCP endpoint, as the API server's
// SecureServingInfo builds its tls.Config: a base configuration that the
// DynamicServingCertificateController completes with the current
// certificate and CA for each connection. nil in plaintext.
func (vm *VolumeManager) newTCPTLS() (*tcpTLS, error) {
	a := vm.cfg.HTTPAccess
	if a.Plaintext {
		return nil, nil
	}
	t := &tcpTLS{certFile: a.CertFile, selfSigned: a.CertFile == ""}
	keyFile := a.KeyFile
	if t.certFile == "" {
		dir := a.CertDir
		if dir == "" {
			dir = filepath.Join(vm.cfg.RootDir, "pki")
		}
		host, _, _ := net.SplitHostPort(vm.cfg.HTTPEndpoint)
		subject, names, ips, err := servingcert.HostNames(host, vm.cfg.NodeName)
		if err != nil {
			return nil, &ConfigError{Field: "HTTPEndpoint", Err: err}
		}
		opts := servingcert.Options{Dir: dir, Host: subject, DNSNames: names, IPs: ips}
		if t.certFile, keyFile, t.generated, err = servingcert.Ensure(opts); err != nil {
			return nil, &ConfigError{Field: "HTTPAccess.CertDir", Err: err}
		}
		t.renewer = &servingcert.Renewer{Options: opts, Clock: vm.cfg.servingCertClock}
	}
	var err error
	if t.cert, err = dynamiccertificates.NewDynamicServingContentFromFiles("serving-cert", t.certFile, keyFile); err != nil {
		field := "HTTPAccess.CertFile"
		if a.CertFile == "" {
			field = "HTTPAccess.CertDir"
		}
		return nil, &ConfigError{Field: field, Err: err}
	}
	base := &tls.Config{
		MinVersion:   max(a.MinVersion, tls.VersionTLS12),
		CipherSuites: a.CipherSuites,
		NextProtos:   []string{"http/1.1"},
	}
	var clientCA dynamiccertificates.CAContentProvider
	if a.ClientCAFile != "" {
		if t.clientCA, err = dynamiccertificates.NewDynamicCAContentFromFile("client-ca", a.ClientCAFile); err != nil {
			return nil, &ConfigError{Field: "HTTPAccess.ClientCAFile", Err: err}
		}
		clientCA = t.clientCA
		// Ask for a certificate and let the guard verify it: a caller
		// with a token needs none.
		base.ClientAuth = tls.RequestClientCert
	}
	t.ctrl = dynamiccertificates.NewDynamicServingCertificateController(base, clientCA, t.cert, nil, nil)
	t.cert.AddListener(t.ctrl)
	if t.clientCA != nil {
		t.clientCA.AddListener(t.ctrl)
	}
	if err := t.ctrl.RunOnce(); err != nil {
		return nil, &ConfigError{Field: "HTTPEndpoint", Err: fmt.Errorf("the TLS configuration: %w", err)}
	}
	base.GetConfigForClient = t.ctrl.GetConfigForClient
	t.config = base
	return t, nil
}

// guardConfig is the apiauth configuration of the TCP endpoint.
func (vm *VolumeManager) guardConfig(t *tcpTLS) apiauth.Config {
	a := vm.cfg.HTTPAccess
	c := apiauth.Config{
		Client: vm.authClient(), NodeName: vm.cfg.NodeName, APIAudiences: a.APIAudiences,
		AuthenticationCacheTTL: a.AuthenticationCacheTTL, AllowCacheTTL: a.AllowCacheTTL, DenyCacheTTL: a.DenyCacheTTL,
	}
	if t != nil && t.clientCA != nil {
		c.ClientCA = t.clientCA
	}
	return c
}

// wrap returns l serving TLS, or l itself in plaintext.
func (t *tcpTLS) wrap(l net.Listener) net.Listener {
	if t == nil {
		return l
	}
	return tls.NewListener(l, t.config)
}

// start runs the controllers that follow the certificate and the CA on
// disk until the returned stop is called.
func (t *tcpTLS) start(ctx context.Context, wg *sync.WaitGroup) (stop func()) {
	if t == nil {
		klog.FromContext(ctx).Info("Serving plain HTTP on the loopback TCP endpoint")
		return func() {}
	}
	klog.FromContext(ctx).Info("Serving TLS on the TCP endpoint", "certificate", t.certFile, "selfSigned", t.selfSigned, "generated", t.generated, "clientCA", t.clientCA != nil)
	ctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { t.cert.Run(ctx, 1) })
	if t.clientCA != nil {
		wg.Go(func() { t.clientCA.Run(ctx, 1) })
	}
	wg.Go(func() { t.ctrl.Run(1, ctx.Done()) })
	if t.renewer != nil {
		wg.Go(func() { t.renewer.Run(ctx) })
	}
	return cancel
}
