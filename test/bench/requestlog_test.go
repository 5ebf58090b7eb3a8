package bench_test

import (
	"net/http"
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

// firstWatch returns when the first watch request whose URL holds all of
// parts was sent at or after since.
func (l *requestLog) firstWatch(since time.Time, parts ...string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, r := range l.sent {
		if r.at.Before(since) || r.method != http.MethodGet || !strings.Contains(r.url, "watch=true") {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(r.url, p) {
				continue next
			}
		}
		return r.at, true
	}
	return time.Time{}, false
}
