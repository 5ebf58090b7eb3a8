package volumemanager

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// DefaultHTTPMaxConnections is the default of Config.HTTPMaxConnections:
// far above what the callers of a node agent hold (a runtime, a metrics
// scraper, the kubelet's probes), and a bound on what a flood of idle
// connections costs (each some 10 KiB of buffers and a goroutine).
const DefaultHTTPMaxConnections = 256

// ServerLimits are the TCP endpoint's bounds, as the kubelet's :10250
// server and k8s.io/apiserver's secure serving bound theirs: against
// callers that hold connections open, send slowly, send too much, or send
// made-up tokens, each of which costs the API server a TokenReview.
type ServerLimits struct {
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are
	// the http.Server's: to read a request's headers, to read it whole,
	// to answer it (from the end of its headers), and how long a
	// keep-alive connection may wait for its next request.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// LongPollSlack is added to a long poll's own timeout (?wait=, at most
	// maxWait): the poll is exempt from WriteTimeout and bounded by its
	// timeout plus this instead.
	LongPollSlack time.Duration
	// MaxHeaderBytes bounds a request's headers: 431 beyond.
	MaxHeaderBytes int
	// MaxConnections bounds the open connections, MaxConnectionsPerSource
	// those of one address; 0: no bound.
	MaxConnections, MaxConnectionsPerSource int
	// Failures bound the failed authentications of one address: 429,
	// without a TokenReview, beyond.
	Failures apiauth.FailureLimits
}

// defaultServerLimits are the TCP endpoint's bounds with maxConns
// connections.
func defaultServerLimits(maxConns int) ServerLimits {
	if maxConns == 0 {
		maxConns = DefaultHTTPMaxConnections
	}
	return ServerLimits{
		ReadHeaderTimeout: 10 * time.Second,
		// Room for a running-pods report of 4 MiB on a slow link.
		ReadTimeout: time.Minute,
		// Room for a 30 s CPU profile (pprof's default) and a slow reader.
		WriteTimeout: 2 * time.Minute,
		// k8s.io/apiserver's secure serving.
		IdleTimeout:   90 * time.Second,
		LongPollSlack: 30 * time.Second,
		// A bearer token is a few KiB; k8s.io/apiserver allows 1 MiB.
		MaxHeaderBytes:          64 << 10,
		MaxConnections:          maxConns,
		MaxConnectionsPerSource: max(1, maxConns/4),
	}
}

// serverLimits are vm's TCP bounds: Config.limits in tests, else the
// defaults of Config.HTTPMaxConnections.
func (vm *VolumeManager) serverLimits() ServerLimits {
	if vm.cfg.limits != nil {
		return *vm.cfg.limits
	}
	return defaultServerLimits(vm.cfg.HTTPMaxConnections)
}

// bound sets l's timeouts and header bound on srv.
func (l ServerLimits) bound(srv *http.Server) {
	srv.ReadHeaderTimeout, srv.ReadTimeout = l.ReadHeaderTimeout, l.ReadTimeout
	srv.WriteTimeout, srv.IdleTimeout = l.WriteTimeout, l.IdleTimeout
	srv.MaxHeaderBytes = l.MaxHeaderBytes
}

// extendForLongPoll exempts the request of w from the server's write
// timeout for a long poll of timeout: its write deadline becomes timeout
// plus slack from now. (The read timeout does not reach a handler without
// a body: net/http clears the read deadline while the handler runs.)
// Servers without deadlines, the API socket's, ignore it.
func extendForLongPoll(w http.ResponseWriter, timeout, slack time.Duration) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeout + slack))
}

// longPollSlack is vm's LongPollSlack.
func (vm *VolumeManager) longPollSlack() time.Duration { return vm.serverLimits().LongPollSlack }

// maxRequestBody bounds the body of every request but a running-pods
// report, none of which reads one.
const maxRequestBody = 64 << 10

// limitBodies answers 413 to a request whose declared body is larger than
// its route takes, and bounds what the handler can read of any other
// (http.MaxBytesReader: an error, and the connection closed, past the
// bound). A running-pods report may have maxRunningPodsBody, every other
// request maxRequestBody.
func limitBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := int64(maxRequestBody)
		if r.URL.Path == RunningPodsPath {
			limit = maxRunningPodsBody
		}
		if r.ContentLength > limit {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		next.ServeHTTP(w, r)
	})
}

// isTooLarge says whether err is a body's read past its MaxBytesReader.
func isTooLarge(err error) bool {
	_, ok := errors.AsType[*http.MaxBytesError](err)
	return ok
}

// limitListener bounds the connections l accepts: at most total open, at
// most perSource from one address (apiauth.SourceKey). A connection past
// either bound is closed at once, rather than left waiting in the
// kernel's queue behind those of whoever holds the others, and refused is
// called. 0: no bound.
func limitListener(l net.Listener, total, perSource int, refused func()) net.Listener {
	if total <= 0 && perSource <= 0 {
		return l
	}
	return &limitedListener{Listener: l, total: total, perSource: perSource, refused: refused, bySource: map[string]int{}}
}

type limitedListener struct {
	net.Listener
	total, perSource int
	refused          func()

	// mu guards open and bySource.
	mu sync.Mutex
	// open counts the open connections; bySource those of each source
	// with any.
	open     int
	bySource map[string]int
}

// Accept returns the next connection within the bounds, closing those
// past them.
func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		source := apiauth.SourceKey(c.RemoteAddr().String())
		if l.acquire(source) {
			return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.release(source) })}, nil
		}
		_ = c.Close()
		l.refused()
	}
}

func (l *limitedListener) acquire(source string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.total > 0 && l.open >= l.total) || (l.perSource > 0 && l.bySource[source] >= l.perSource) {
		return false
	}
	l.open++
	l.bySource[source]++
	return true
}

func (l *limitedListener) release(source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.bySource[source]--; l.bySource[source] <= 0 {
		delete(l.bySource, source)
	}
}

// limitedConn gives its place back once closed.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// limitConnections bounds l by vm's MaxConnections and
// MaxConnectionsPerSource.
func (vm *VolumeManager) limitConnections(l net.Listener) net.Listener {
	lim := vm.serverLimits()
	return limitListener(l, lim.MaxConnections, lim.MaxConnectionsPerSource, vm.httpRefused.WithLabelValues(refusedConnections).Inc)
}

// The reasons of csi_volmgr_http_refused_total.
const (
	refusedConnections = "connections"
	refusedFailures    = "failed_authentications"
)

// newHTTPRefused registers csi_volmgr_http_refused_total on reg, both
// reasons at 0.
func newHTTPRefused(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "csi_volmgr_http_refused_total",
		Help: "Connections and requests the TCP endpoint (--http-endpoint) refused before serving them, by reason: connections (past --http-max-connections, or a quarter of it from one address: closed as soon as accepted), failed_authentications (429 before any TokenReview: the address failed to authenticate more often than allowed).",
	}, []string{"reason"})
	reg.MustRegister(c)
	c.WithLabelValues(refusedConnections)
	c.WithLabelValues(refusedFailures)
	return c
}

// authClient is the client of the TCP endpoint's reviews: AuthClient,
// else KubeClient.
func (vm *VolumeManager) authClient() kubernetes.Interface {
	if vm.cfg.AuthClient != nil {
		return vm.cfg.AuthClient
	}
	return vm.cfg.KubeClient
}

// failureLimiter is the limiter of vm's failed authentications, counted
// in csi_volmgr_http_refused_total.
func (vm *VolumeManager) failureLimiter() *apiauth.FailureLimiter {
	l := vm.serverLimits().Failures
	l.OnLimited = vm.httpRefused.WithLabelValues(refusedFailures).Inc
	return apiauth.NewFailureLimiter(l)
}
