package bench_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// countingProxy stands between an agent and kube-apiserver and counts the
// agent's requests by verb (GET of one object, LIST, WATCH, and the
// writes) and resource, and the watches open. Streams (watches) are passed
// on as they come.
//
// Under the admin identity it listens on plain HTTP on 127.0.0.1 and
// forwards with the API server's admin credentials, so an agent's
// kubeconfig (kubeconfig) names only its address. Under the node identity
// (EnvIdentity) it re-originates TLS, so it cannot pass the agent's client
// certificate on: it serves HTTPS on 127.0.0.1 with a certificate of its
// own, authenticates the agent by its client certificate as kube-apiserver
// would (issued by the Env's Signer, for the world's Node, else 401/403),
// and forwards with a certificate of the same Node: the API server sees
// system:node:<Node> in system:nodes, and the Node authorizer and
// NodeRestriction hold every request to that Node as without the proxy.
type countingProxy struct {
	server *http.Server
	addr   string
	// caPEM is the certificate the agents trust the proxy by (TLS only).
	caPEM []byte

	// mu guards the fields below.
	mu      sync.Mutex
	counts  map[string]int // "VERB resource" → requests
	open    int
	maxOpen int
}

// startProxy starts a proxy to the world's API server, as the world's Node
// under the node identity, stopped when tb ends.
func startProxy(tb testing.TB, w *world) *countingProxy {
	tb.Helper()
	cfg := w.fx.Config
	node := agentIdentity == identityNode
	if node {
		certPEM, keyPEM := w.nodeCert(tb)
		cfg = k8stest.CertConfig(w.fx.Env.Config, certPEM, keyPEM)
	}
	target, err := url.Parse(cfg.Host)
	if err != nil {
		tb.Fatal(err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	p := &countingProxy{counts: map[string]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = target.Host
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorLog:      nil,
		// A request kube-apiserver forbade is counted once more, as
		// "FORBIDDEN <verb resource>" (not in any verb's sum): what the
		// Node authorizer or NodeRestriction refused the agent.
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode == http.StatusForbidden {
				key, _ := classify(resp.Request)
				p.mu.Lock()
				p.counts["FORBIDDEN "+key]++
				p.mu.Unlock()
			}
			return nil
		},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p.addr = l.Addr().String()
	user := nodeUser(w.fx.NodeName)
	p.server = &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if node {
			if code, msg := authenticateNode(r, user); code != 0 {
				// Counted apart: an agent that is refused here would be
				// refused by kube-apiserver too.
				p.mu.Lock()
				p.counts[fmt.Sprintf("REFUSED %d", code)]++
				p.mu.Unlock()
				http.Error(rw, msg, code)
				return
			}
		}
		key, watching := classify(r)
		p.mu.Lock()
		p.counts[key]++
		if watching {
			p.open++
			p.maxOpen = max(p.maxOpen, p.open)
		}
		p.mu.Unlock()
		if watching {
			defer func() {
				p.mu.Lock()
				p.open--
				p.mu.Unlock()
			}()
		}
		rp.ServeHTTP(rw, r)
	})}
	serve := func() error { return p.server.Serve(l) }
	if node {
		certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
		if err != nil {
			tb.Fatal(err)
		}
		serving, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			tb.Fatal(err)
		}
		clients := x509.NewCertPool()
		clients.AppendCertsFromPEM(w.fx.Env.Signer.CertPEM())
		p.caPEM = certPEM
		p.server.TLSConfig = &tls.Config{
			Certificates: []tls.Certificate{serving},
			ClientAuth:   tls.VerifyClientCertIfGiven,
			ClientCAs:    clients,
			MinVersion:   tls.VersionTLS12,
		}
		serve = func() error { return p.server.ServeTLS(l, "", "") }
	}
	go func() {
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("counting proxy: %v\n", err)
		}
	}()
	tb.Cleanup(func() { _ = p.server.Close() })
	return p
}

// authenticateNode checks that r comes with a verified client certificate
// (the TLS handshake verified it against the Env's Signer) of user in
// system:nodes: 0 if so, else the status code and message kube-apiserver's
// authenticator and the Node authorizer would answer with.
func authenticateNode(r *http.Request, user string) (int, string) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return http.StatusUnauthorized, "counting proxy: no client certificate of the Node's signer"
	}
	leaf := r.TLS.VerifiedChains[0][0]
	if leaf.Subject.CommonName != user || !slices.Contains(leaf.Subject.Organization, nodeGroup) {
		return http.StatusForbidden, fmt.Sprintf("counting proxy: %s in %v is not %s in %s",
			leaf.Subject.CommonName, leaf.Subject.Organization, user, nodeGroup)
	}
	return 0, ""
}

// kubeconfig is a kubeconfig naming the proxy, with the client certificate
// certPEM and its key keyPEM if given, else without credentials.
func (p *countingProxy) kubeconfig(tb testing.TB, certPEM, keyPEM []byte) []byte {
	tb.Helper()
	if p.caPEM == nil {
		return kubeconfigFor(tb, "http://"+p.addr, nil, certPEM, keyPEM)
	}
	return kubeconfigFor(tb, "https://"+p.addr, p.caPEM, certPEM, keyPEM)
}

// take returns the counts so far and the most watches open at once, and
// starts counting again from zero (open watches stay open).
func (p *countingProxy) take() (map[string]int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	counts, maxOpen := p.counts, p.maxOpen
	p.counts, p.maxOpen = map[string]int{}, p.open
	return counts, maxOpen
}

// classify names a request "VERB resource": GET (one object), LIST, WATCH,
// CREATE, UPDATE, PATCH, DELETE; resource with its subresource, e.g.
// "persistentvolumeclaims" or "pods/status".
func classify(r *http.Request) (string, bool) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// /api/v1/... or /apis/<group>/<version>/...
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return r.Method + " " + r.URL.Path, false
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) != 2 {
		parts = parts[2:]
	}
	resource, named := "", false
	switch len(parts) {
	case 0:
		resource = "discovery"
	case 1:
		resource = parts[0]
	case 2:
		resource, named = parts[0], true
	default:
		resource, named = parts[0]+"/"+parts[2], true
	}
	watching := r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1"
	verb := ""
	switch r.Method {
	case http.MethodGet:
		switch {
		case watching:
			verb = "WATCH"
		case named:
			verb = "GET"
		default:
			verb = "LIST"
		}
	case http.MethodPost:
		verb = "CREATE"
	case http.MethodPut:
		verb = "UPDATE"
	case http.MethodPatch:
		verb = "PATCH"
	case http.MethodDelete:
		verb = "DELETE"
	default:
		verb = r.Method
	}
	return verb + " " + resource, watching
}

// summarize renders counts, biggest first, and sums them by verb.
func summarize(counts map[string]int) (text string, byVerb map[string]int) {
	byVerb = map[string]int{}
	keys := make([]string, 0, len(counts))
	for k, n := range counts {
		keys = append(keys, k)
		verb, _, _ := strings.Cut(k, " ")
		byVerb[verb] += n
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s=%d ", k, counts[k])
	}
	return strings.TrimSpace(sb.String()), byVerb
}
