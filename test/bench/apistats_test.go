package bench_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// apiRequests records the API requests of every client in this process by
// verb and URL template ("/api/v1/namespaces/{namespace}/pods"): how many
// went through their client's rate limiter (every request and retry does)
// and how long they waited for it. The
// benchmarks' own clients have a limit (creatorQPS) they never reach, so
// the waits are the agent's.
var apiRequests = &apiStats{byKey: map[string]*apiStat{}}

type apiStats struct {
	// mu guards byKey.
	mu    sync.Mutex
	byKey map[string]*apiStat
}

type apiStat struct {
	sent      int
	throttled int
	waited    time.Duration
}

// Observe records a rate-limiter wait (metrics.LatencyMetric).
func (s *apiStats) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stat(verb, u)
	st.sent++
	st.waited += latency
	if latency > time.Millisecond {
		st.throttled++
	}
}

func (s *apiStats) stat(verb string, u url.URL) *apiStat {
	key := verb + " " + u.Path
	st, ok := s.byKey[key]
	if !ok {
		st = &apiStat{}
		s.byKey[key] = st
	}
	return st
}

// snapshot copies the counters.
func (s *apiStats) snapshot() map[string]apiStat {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]apiStat, len(s.byKey))
	for k, v := range s.byKey {
		out[k] = *v
	}
	return out
}

// since renders what changed after before, biggest total wait first:
// requests sent, how many waited > 1ms for the client's rate limiter, and
// the total wait.
func (s *apiStats) since(before map[string]apiStat) string {
	type row struct {
		key string
		d   apiStat
	}
	var rows []row
	var total apiStat
	for k, v := range s.snapshot() {
		b := before[k]
		d := apiStat{sent: v.sent - b.sent, throttled: v.throttled - b.throttled, waited: v.waited - b.waited}
		if d.sent == 0 && d.waited == 0 {
			continue
		}
		rows = append(rows, row{k, d})
		total.sent += d.sent
		total.throttled += d.throttled
		total.waited += d.waited
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.d.waited - a.d.waited) })
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n  %-80s %6s %9s %12s", "request", "sent", "throttled", "waited")
	for _, r := range rows {
		fmt.Fprintf(&sb, "\n  %-80s %6d %9d %12v", r.key, r.d.sent, r.d.throttled, r.d.waited.Round(time.Millisecond))
	}
	fmt.Fprintf(&sb, "\n  %-80s %6d %9d %12v", "total", total.sent, total.throttled, total.waited.Round(time.Millisecond))
	return sb.String()
}
