package apiauth

import (
	"container/list"
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// The defaults of FailureLimits: a source may fail 20 times in a row, then
// once a second; 4,096 sources are remembered.
const (
	DefaultFailuresPerSecond = 1
	DefaultFailureBurst      = 20
	DefaultMaxSources        = 4096
)

// FailureLimits bound the failed authentications of one source (an IP
// address; an IPv6 address by its /64, which one host usually holds
// whole).
type FailureLimits struct {
	// PerSecond and Burst are the source's token bucket: a request takes
	// a token, and gets it back unless it is answered 401. 0 means the
	// Default of each.
	PerSecond float64
	Burst     int
	// MaxSources bounds how many sources are remembered; beyond it the
	// least recently seen is forgotten. 0 means DefaultMaxSources.
	MaxSources int
	// OnLimited, when set, is called for every request answered 429 (a
	// metric).
	OnLimited func()
}

// FailureLimiter answers 429 Too Many Requests, before any
// authentication and so without a TokenReview, to a source whose requests
// were answered 401 more often than its FailureLimits allow: a flood of
// made-up tokens costs the API server at most Burst reviews, then
// PerSecond, per source. Requests that authenticate cost nothing. It is
// safe for concurrent use.
type FailureLimiter struct {
	perSecond float64
	burst     float64
	max       int
	now       func() time.Time
	onLimited func()

	// mu guards sources and recent.
	mu sync.Mutex
	// sources are the buckets by source key; recent orders them, the most
	// recently used first.
	sources map[string]*list.Element
	recent  *list.List
}

// bucket is one source's tokens as of last.
type bucket struct {
	key    string
	tokens float64
	last   time.Time
}

// NewFailureLimiter returns the limiter of l.
func NewFailureLimiter(l FailureLimits) *FailureLimiter {
	f := &FailureLimiter{
		perSecond: l.PerSecond, burst: float64(l.Burst), max: l.MaxSources, now: time.Now, onLimited: l.OnLimited,
		sources: map[string]*list.Element{}, recent: list.New(),
	}
	if f.perSecond <= 0 {
		f.perSecond = DefaultFailuresPerSecond
	}
	if f.burst <= 0 {
		f.burst = DefaultFailureBurst
	}
	if f.max <= 0 {
		f.max = DefaultMaxSources
	}
	return f
}

// Wrap returns a handler that answers 429 to a source out of tokens and
// passes every other request to next (the Guard's handler), taking a token
// for it that it gives back unless next answers 401: as soon as the
// request reaches Authenticated below next, or else once next returns. A
// nil f returns next.
func (f *FailureLimiter) Wrap(next http.Handler) http.Handler {
	if f == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := SourceKey(r.RemoteAddr)
		if !f.take(key) {
			if f.onLimited != nil {
				f.onLimited()
			}
			w.Header().Set("Retry-After", "1")
			http.Error(w, "Too many failed authentications", http.StatusTooManyRequests)
			return
		}
		p := &pending{refund: sync.OnceFunc(func() { f.refund(key) })}
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), pendingKey{}, p)))
		if sw.status != http.StatusUnauthorized {
			p.refund()
		}
	})
}

// Authenticated returns a handler that gives the request's token back to
// its source at once, then passes it to next: put it below the Guard, so
// that a request the Guard let through (a long poll may last minutes)
// holds no token of its source while it runs. A nil f returns next.
func (f *FailureLimiter) Authenticated(next http.Handler) http.Handler {
	if f == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := r.Context().Value(pendingKey{}).(*pending); ok {
			p.refund()
		}
		next.ServeHTTP(w, r)
	})
}

// pending is a request's token, given back once.
type pending struct{ refund func() }

type pendingKey struct{}

// take takes a token of key's bucket, false if it has none.
func (f *FailureLimiter) take(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bucketOf(key)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// refund gives key's token back.
func (f *FailureLimiter) refund(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bucketOf(key)
	b.tokens = min(f.burst, b.tokens+1)
}

// bucketOf returns key's bucket filled up to now, a full one for a source
// not remembered, forgetting the least recently used beyond max. f.mu is
// held.
func (f *FailureLimiter) bucketOf(key string) *bucket {
	now := f.now()
	if e, ok := f.sources[key]; ok {
		f.recent.MoveToFront(e)
		b := e.Value.(*bucket)
		b.tokens = min(f.burst, b.tokens+now.Sub(b.last).Seconds()*f.perSecond)
		b.last = now
		return b
	}
	b := &bucket{key: key, tokens: f.burst, last: now}
	f.sources[key] = f.recent.PushFront(b)
	for f.recent.Len() > f.max {
		oldest := f.recent.Back()
		f.recent.Remove(oldest)
		delete(f.sources, oldest.Value.(*bucket).key)
	}
	return b
}

// Sources is how many sources f remembers.
func (f *FailureLimiter) Sources() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recent.Len()
}

// SourceKey is the source a request's remote address is counted as: its
// IP address, an IPv6 address's /64 prefix, or the address as it is when
// it has no IP.
func SourceKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	return netip.PrefixFrom(ip, 64).Masked().String()
}

// statusWriter records the status a handler answers; Unwrap lets
// http.ResponseController reach the connection (the long poll's deadline).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
