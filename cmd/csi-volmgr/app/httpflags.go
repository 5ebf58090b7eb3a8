package app

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/servingcert"
)

// addHTTPFlags registers the flags that secure --http-endpoint, named as
// the kubelet names those of its port 10250.
func (o *RunOptions) addHTTPFlags(fs *pflag.FlagSet) {
	c := o.CSIVolmgrConfiguration
	fs.BoolVar(&c.HTTPEndpointPlaintext, "http-endpoint-plaintext", c.HTTPEndpointPlaintext, "Serve plain HTTP instead of TLS on --http-endpoint. Allowed only when --http-endpoint is a loopback address (127.0.0.1, ::1 or localhost), which no other host reaches; any other address always serves TLS, and the agent refuses to start with this flag there.")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile, "Serving certificate of --http-endpoint (PEM, followed by its intermediates), read again when it changes on disk. Empty: a self-signed certificate for the host's name, --node-name, localhost, the loopback addresses and those of --http-endpoint (every address of the host when it has none), which the agent keeps in --cert-dir ("+servingcert.CertFileName+" and "+servingcert.KeyFileName+", empty --cert-dir means <root-dir>/pki) and replaces when it no longer fits (at start, and 30 days before it expires while running); clients trust it with --certificate-authority <that file>.")
	fs.StringVar(&c.TLSPrivateKeyFile, "tls-private-key-file", c.TLSPrivateKeyFile, "Private key of --tls-cert-file (PEM), read again when it changes on disk.")
	fs.StringVar(&c.TLSMinVersion, "tls-min-version", c.TLSMinVersion, "Lowest TLS version --http-endpoint serves: VersionTLS12 or VersionTLS13.")
	fs.StringSliceVar(&c.TLSCipherSuites, "tls-cipher-suites", c.TLSCipherSuites, "Comma-separated TLS 1.2 cipher suites --http-endpoint serves; empty means Go's defaults (TLS 1.3's are not configurable). Preferred values: "+strings.Join(cliflag.PreferredTLSCipherNames(), ", ")+".")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", c.ClientCAFile, "CA bundle (PEM) of the client certificates --http-endpoint accepts, read again when it changes: a certificate it signed authenticates as the user of its common name in the groups of its organizations, authorized by the API server as a token's user is. Empty accepts no client certificate. Needs an API server.")
	fs.StringSliceVar(&c.APIAudiences, "api-audiences", c.APIAudiences, "Audiences a bearer token sent to --http-endpoint must be issued for (one of them; the TokenReview asks the API server for them). A token for the API server's own audience is refused: callers use `kubectl create token SA --audience "+apiauth.DefaultAPIAudience+"` or a projected ServiceAccount token of that audience, which the API server refuses in turn, so a token sent to the agent cannot be replayed there.")
	fs.DurationVar(&c.AuthenticationTokenWebhookCacheTTL.Duration, "authentication-token-webhook-cache-ttl", c.AuthenticationTokenWebhookCacheTTL.Duration, "How long the API server's review of a bearer token (TokenReview) is cached (as the kubelet's flag).")
	fs.DurationVar(&c.AuthorizationWebhookCacheAuthorizedTTL.Duration, "authorization-webhook-cache-authorized-ttl", c.AuthorizationWebhookCacheAuthorizedTTL.Duration, "How long an allowed SubjectAccessReview is cached: a revoked grant keeps working up to this long (as the kubelet's flag).")
	fs.DurationVar(&c.AuthorizationWebhookCacheUnauthorizedTTL.Duration, "authorization-webhook-cache-unauthorized-ttl", c.AuthorizationWebhookCacheUnauthorizedTTL.Duration, "How long a denied SubjectAccessReview is cached: a new grant takes up to this long to work (as the kubelet's flag).")
}

// httpAccess turns the flags of addHTTPFlags into the volume manager's
// HTTPAccessConfig; the TLS names are parsed here, the rest is checked by
// the volume manager.
func (o *RunOptions) httpAccess() (volumemanager.HTTPAccessConfig, error) {
	var errs []error
	minVersion, err := cliflag.TLSVersion(o.TLSMinVersion)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", o.flagName("tls-min-version"), err))
	}
	suites, err := cliflag.TLSCipherSuites(o.TLSCipherSuites)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", o.flagName("tls-cipher-suites"), err))
	}
	return volumemanager.HTTPAccessConfig{
		Plaintext:              o.HTTPEndpointPlaintext,
		CertFile:               o.TLSCertFile,
		KeyFile:                o.TLSPrivateKeyFile,
		CertDir:                o.CertDir,
		MinVersion:             minVersion,
		CipherSuites:           suites,
		ClientCAFile:           o.ClientCAFile,
		APIAudiences:           o.APIAudiences,
		AuthenticationCacheTTL: o.AuthenticationTokenWebhookCacheTTL.Duration,
		AllowCacheTTL:          o.AuthorizationWebhookCacheAuthorizedTTL.Duration,
		DenyCacheTTL:           o.AuthorizationWebhookCacheUnauthorizedTTL.Duration,
	}, errors.Join(errs...)
}

// flagName names a flag in an error: with a configuration file, the
// file's field first (tlsMinVersion (--tls-min-version)).
func (o *RunOptions) flagName(flag string) string {
	if o.ConfigFile != "" {
		return configField[flag] + " (--" + flag + ")"
	}
	return "--" + flag
}
