package apiauth_test

import (
	"bytes"
	"flag"
	"net/http"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// lockedBuffer is klog's output in a test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestTokenReviewsNotLogged runs the Guard with klog at -v=10, where
// client-go logs request and response bodies: the SubjectAccessReview's
// bodies are in the log, the TokenReview's (which hold the caller's
// token) are not, nor is the token anywhere. Not parallel: it sets klog's
// global verbosity and output.
func TestTokenReviewsNotLogged(t *testing.T) {
	var fs flag.FlagSet
	klog.InitFlags(&fs)
	out := &lockedBuffer{}
	for name, value := range map[string]string{"v": "10", "logtostderr": "false", "alsologtostderr": "false"} {
		if err := fs.Set(name, value); err != nil {
			t.Fatal(err)
		}
	}
	klog.SetOutput(out)
	t.Cleanup(func() {
		_ = fs.Set("v", "0")
		_ = fs.Set("logtostderr", "true")
	})

	guard, reviews := reviewedGuard(t)
	h := guard.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	// "good" authenticates; the made-up token does not.
	const madeUp = "made-up-s3cr3t-token"
	if code := get(h, "192.0.2.1:1", madeUp); code != http.StatusUnauthorized {
		t.Fatalf("made-up token answered %d, want 401", code)
	}
	if code := get(h, "192.0.2.1:1", "good"); code != http.StatusOK {
		t.Fatalf("good token answered %d, want 200", code)
	}
	klog.Flush()
	log := out.String()
	if reviews.Load() != 2 || !strings.Contains(log, "subjectaccessreviews") || !strings.Contains(log, "Request Body") {
		t.Fatalf("%d TokenReviews, and the -v=10 log holds no SubjectAccessReview body; the test proves nothing:\n%s", reviews.Load(), log)
	}
	if strings.Contains(log, madeUp) || strings.Contains(log, `"token":"good"`) {
		t.Errorf("a caller's token is in the -v=10 log:\n%s", log)
	}
	if strings.Contains(log, `"kind":"TokenReview"`) {
		t.Errorf("a TokenReview body is in the -v=10 log:\n%s", log)
	}
}
