package apiauth_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// reviewedGuard is a Guard on a stand-in API server that authenticates
// the token "good" (and allows it everything) and nothing else, and counts
// the TokenReviews it is asked for.
func reviewedGuard(t *testing.T) (*apiauth.Guard, *atomic.Int64) {
	t.Helper()
	var reviews atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			reviews.Add(1)
			var tr authenticationv1.TokenReview
			if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if tr.Spec.Token == "good" {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "runtime"}}
			}
			_ = json.NewEncoder(w).Encode(&tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var sar authorizationv1.SubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			sar.Status.Allowed = true
			_ = json.NewEncoder(w).Encode(&sar)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(api.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	g, err := apiauth.New(apiauth.Config{Client: client, NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	return g, &reviews
}

func get(h http.Handler, remote, token string) int {
	r := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
	r.RemoteAddr = remote
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// TestFailureLimiter: a source that sends made-up tokens gets 401 for
// Burst of them, each one TokenReview, then 429 without a review; another
// source still gets its reviews; a source whose requests authenticate is
// never limited; the bucket refills at PerSecond.
func TestFailureLimiter(t *testing.T) {
	guard, reviews := reviewedGuard(t)
	limiter := apiauth.NewFailureLimiter(apiauth.FailureLimits{PerSecond: 10, Burst: 5})
	h := limiter.Wrap(guard.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })))

	const attacker, other = "192.0.2.1:40000", "192.0.2.2:40000"
	for i := range 5 {
		if code := get(h, attacker, "made-up-"+strconv.Itoa(i)); code != http.StatusUnauthorized {
			t.Fatalf("made-up token %d answered %d, want 401", i, code)
		}
	}
	if n := reviews.Load(); n != 5 {
		t.Fatalf("%d TokenReviews for 5 made-up tokens, want 5", n)
	}
	for i := range 50 {
		if code := get(h, attacker, "more-"+strconv.Itoa(i)); code != http.StatusTooManyRequests {
			t.Fatalf("made-up token past the burst answered %d, want 429", code)
		}
	}
	if n := reviews.Load(); n != 5 {
		t.Errorf("%d TokenReviews after 50 limited requests, want still 5", n)
	}
	// Another source is not limited by the first.
	if code := get(h, other, "made-up"); code != http.StatusUnauthorized {
		t.Errorf("another source answered %d, want 401", code)
	}
	// A source that authenticates keeps its tokens.
	for i := range 20 {
		if code := get(h, "192.0.2.3:1", "good"); code != http.StatusOK {
			t.Fatalf("good token, request %d, answered %d, want 200", i, code)
		}
	}
	// Requests that authenticate and then run long (long polls) hold no
	// token of their source while they run: 30 at once, past the burst.
	release, arrived := make(chan struct{}), make(chan struct{}, 30)
	slow := limiter.Wrap(guard.Wrap(limiter.Authenticated(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived <- struct{}{}
		<-release
		w.WriteHeader(http.StatusOK)
	}))))
	codes := make(chan int, 30)
	for range 30 {
		go func() { codes <- get(slow, "192.0.2.4:1", "good") }()
	}
	timeout := time.After(10 * time.Second)
	for i := range 30 {
		select {
		case <-arrived:
			continue
		case <-timeout:
			t.Errorf("only %d of 30 long requests with a good token reached the handler at once", i)
		}
		break
	}
	close(release)
	for range 30 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("one of 30 long requests with a good token answered %d, want 200", code)
		}
	}

	// The bucket refills: 10 per second.
	time.Sleep(250 * time.Millisecond)
	if code := get(h, attacker, "after-refill"); code != http.StatusUnauthorized {
		t.Errorf("after the refill the source answered %d, want 401 (reviewed)", code)
	}
}

// TestFailureLimiterForgetsOldestSource: the limiter remembers at most
// MaxSources; the least recently seen is forgotten.
func TestFailureLimiterForgetsOldestSource(t *testing.T) {
	limiter := apiauth.NewFailureLimiter(apiauth.FailureLimits{PerSecond: 0.001, Burst: 1, MaxSources: 3})
	h := limiter.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	for i := range 10 {
		get(h, "192.0.2."+strconv.Itoa(i)+":1", "")
	}
	if n := limiter.Sources(); n != 3 {
		t.Errorf("%d sources remembered, want 3", n)
	}
	// 192.0.2.0 was forgotten: a fresh bucket; 192.0.2.9 was not.
	if code := get(h, "192.0.2.0:1", ""); code != http.StatusUnauthorized {
		t.Errorf("a forgotten source answered %d, want 401", code)
	}
	if code := get(h, "192.0.2.9:1", ""); code != http.StatusTooManyRequests {
		t.Errorf("a remembered source out of tokens answered %d, want 429", code)
	}
}

func TestSourceKey(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.1:443":              "192.0.2.1",
		"[::ffff:192.0.2.1]:443":     "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:1":   "2001:db8:1:2::/64",
		"@":                          "@",
	} {
		if got := apiauth.SourceKey(addr); got != want {
			t.Errorf("SourceKey(%q) = %q, want %q", addr, got, want)
		}
	}
}
