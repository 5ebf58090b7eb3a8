package bench_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// countingProxy stands between an agent and kube-apiserver and counts the
// agent's requests by verb (GET of one object, LIST, WATCH, and the
// writes) and resource, and the watches open. It listens on plain HTTP on
// 127.0.0.1 and forwards with the API server's admin credentials, so an
// agent's kubeconfig (kubeconfig) names only its address. Streams (watches)
// are passed on as they come.
type countingProxy struct {
	server *http.Server
	addr   string

	// mu guards the fields below.
	mu      sync.Mutex
	counts  map[string]int // "VERB resource" → requests
	open    int
	maxOpen int
}

// startProxy starts a proxy to cfg's API server, stopped when tb ends.
func startProxy(tb testing.TB, cfg *rest.Config) *countingProxy {
	tb.Helper()
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
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p.addr = l.Addr().String()
	p.server = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		rp.ServeHTTP(w, r)
	})}
	go func() {
		if err := p.server.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("counting proxy: %v\n", err)
		}
	}()
	tb.Cleanup(func() { _ = p.server.Close() })
	return p
}

// kubeconfig is a kubeconfig naming the proxy, without credentials.
func (p *countingProxy) kubeconfig(tb testing.TB) []byte {
	tb.Helper()
	c := clientcmdapi.NewConfig()
	c.Clusters["proxy"] = &clientcmdapi.Cluster{Server: "http://" + p.addr}
	c.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	c.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	c.CurrentContext = "proxy"
	data, err := clientcmd.Write(*c)
	if err != nil {
		tb.Fatal(err)
	}
	return data
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
