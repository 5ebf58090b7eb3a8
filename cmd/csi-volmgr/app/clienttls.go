package app

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
	certutil "k8s.io/client-go/util/cert"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// clientTLSOptions are the TLS flags of the client commands for --server,
// named as kubectl's (a kubeconfig's cluster and user fields).
type clientTLSOptions struct {
	caFile, certFile, keyFile string
	insecure                  bool
}

func (o *clientTLSOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.caFile, "certificate-authority", "", "CA bundle (PEM) that verifies the certificate of an https:// --server: the agent's --tls-cert-file's CA, or its self-signed certificate <cert-dir>/csi-volmgr-serving.crt (copy it from the node). Empty means the system's roots.")
	cmd.Flags().StringVar(&o.certFile, "client-certificate", "", "Client certificate (PEM) for an https:// --server, of a CA in the agent's --client-ca-file: its common name is the user the API server authorizes.")
	cmd.Flags().StringVar(&o.keyFile, "client-key", "", "Private key (PEM) of --client-certificate.")
	cmd.Flags().BoolVar(&o.insecure, "insecure-skip-tls-verify", false, "Do not verify the certificate of an https:// --server: anyone between the client and the agent can read and change what is sent, the token too. Never implied.")
}

// serverURL is --server as a URL prefix: https:// when it has no scheme
// (the agent serves TLS unless told otherwise), without a trailing slash.
func serverURL(server string) string {
	base := strings.TrimSuffix(server, "/")
	if !strings.Contains(base, "://") {
		base = "https://" + base
	}
	return base
}

// validate checks the TLS flags against --server.
func (o *clientTLSOptions) validate(server string) []error {
	var errs []error
	set := o.caFile != "" || o.certFile != "" || o.keyFile != "" || o.insecure
	if set && server == "" {
		errs = append(errs, errors.New("--certificate-authority, --client-certificate, --client-key and --insecure-skip-tls-verify are for --server: the socket needs none"))
		return errs
	}
	if set && strings.HasPrefix(serverURL(server), "http://") {
		errs = append(errs, fmt.Errorf("--certificate-authority, --client-certificate, --client-key and --insecure-skip-tls-verify are for an https:// --server, not %s", server))
	}
	if (o.certFile == "") != (o.keyFile == "") {
		errs = append(errs, errors.New("--client-certificate and --client-key go together"))
	}
	if o.insecure && o.caFile != "" {
		errs = append(errs, errors.New("--insecure-skip-tls-verify and --certificate-authority cannot be used together"))
	}
	return errs
}

// client returns the HTTP client for base. A token goes over http:// only
// to a loopback address: anywhere else it would cross a network in
// cleartext.
func (o *clientTLSOptions) client(base string, withToken bool) (*http.Client, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("--server %s: %w", base, err)
	}
	switch u.Scheme {
	case "http":
		if withToken && !volumemanager.IsLoopbackHost(u.Hostname()) {
			return nil, fmt.Errorf("refusing to send the bearer token over plain HTTP to %s, which is not a loopback address: use https:// (the agent serves TLS unless run with --http-endpoint-plaintext, which only a loopback address allows)", u.Host)
		}
		return &http.Client{}, nil
	case "https":
	default:
		return nil, fmt.Errorf("--server %s: want an http:// or https:// URL", base)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.insecure} //nolint:gosec // only with --insecure-skip-tls-verify
	if o.caFile != "" {
		if cfg.RootCAs, err = certutil.NewPool(o.caFile); err != nil {
			return nil, fmt.Errorf("--certificate-authority: %w", err)
		}
	}
	if o.certFile != "" {
		pair, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--client-certificate and --client-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, Proxy: http.ProxyFromEnvironment}}, nil
}
