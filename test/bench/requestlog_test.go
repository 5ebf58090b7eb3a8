package bench_test

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// requestLog records when the agent's client sent each API request, for
// the per-pod timeline (which watch started when). It wraps the agent's
// transport; it costs a mutex and an append per request.
type requestLog struct {
	// mu guards sent.
	mu   sync.Mutex
	sent []sentRequest
}

type sentRequest struct {
	at     time.Time
	method string
	url    string
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		l.mu.Lock()
		l.sent = append(l.sent, sentRequest{at: time.Now(), method: req.Method, url: req.URL.String()})
		l.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// firstRead returns when the first read of the named object was sent at
// or after since: a GET of it, or a list or watch with the field selector
// metadata.name=<name>, of resource (e.g. "persistentvolumeclaims").
func (l *requestLog) firstRead(since time.Time, resource, name string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.sent {
		if r.at.Before(since) || r.method != http.MethodGet {
			continue
		}
		u, err := url.Parse(r.url)
		if err != nil {
			continue
		}
		if strings.HasSuffix(u.Path, "/"+resource+"/"+name) ||
			(strings.HasSuffix(u.Path, "/"+resource) && u.Query().Get("fieldSelector") == "metadata.name="+name) {
			return r.at, true
		}
	}
	return time.Time{}, false
}
