package volumemanager

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/apiauth"
)

// TestLongPollOutlivesServerTimeouts: with the TCP server's read and write
// timeouts at 300ms, a handler that extends its deadline for a long poll
// answers after 1s with its context alive, through the wrappers the TCP
// endpoint puts around it (limitBodies, the failure limiter); one that
// does not cannot answer.
func TestLongPollOutlivesServerTimeouts(t *testing.T) {
	limits := defaultServerLimits(0)
	limits.ReadTimeout, limits.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond
	mux := http.NewServeMux()
	wait := func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Second)
		if err := r.Context().Err(); err != nil {
			http.Error(w, "context ended: "+err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "done")
	}
	// A handler that answers 200 stands for the Guard.
	mux.Handle("/poll", apiauth.NewFailureLimiter(apiauth.FailureLimits{}).Wrap(limitBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		extendForLongPoll(w, time.Second, 500*time.Millisecond)
		wait(w, r)
	}))))
	mux.HandleFunc("/plain", wait)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	limits.bound(srv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	get := func(path string) (string, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+l.Addr().String()+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if body, err := get("/poll"); err != nil || body != "done" {
		t.Errorf("the long poll: %q, %v; want done", body, err)
	}
	if body, err := get("/plain"); err == nil && body == "done" {
		t.Error("a request past WriteTimeout was answered; the test proves nothing")
	}
}
