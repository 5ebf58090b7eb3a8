package source

import (
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// TestReadFailuresBecomeUnreadable: an object whose reads fail is reported
// unreadable (instead of "not synced", which a pod would wait on for ever:
// issue 23, 1) at once when the API server's answer is final (Forbidden),
// and only after unreadableAfter when it may pass (the server
// unreachable): meanwhile the pod waits, so that the node does not settle
// after an outage without it. The readers hear when it becomes
// unreadable, and a list ends it.
func TestReadFailuresBecomeUnreadable(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, "c", errors.New("no"))
	unavailable := errors.New("dial tcp: connect: connection refused")

	notified := 0
	s := newObjectStore(cache.ObjectName{Namespace: "ns", Name: "c"}, func() { notified++ })
	s.failed(unavailable)
	if _, synced, err := s.state(time.Now()); synced || err != nil || notified != 0 {
		t.Fatalf("after a failure that may pass: synced %v, err %v, notified %d; want not synced, no error yet, no notice", synced, err, notified)
	}
	if _, _, err := s.state(time.Now().Add(unreadableAfter)); !errors.Is(err, unavailable) {
		t.Errorf("after failing for %v: err %v, want %v", unreadableAfter, err, unavailable)
	}
	s.mu.Lock()
	s.failingSince = s.failingSince.Add(-unreadableAfter) // reads have failed that long
	s.mu.Unlock()
	s.failed(unavailable)
	if notified != 1 {
		t.Errorf("notified %d times when the reads had failed for %v, want once", notified, unreadableAfter)
	}

	s = newObjectStore(cache.ObjectName{Namespace: "ns", Name: "c"}, func() { notified++ })
	notified = 0
	s.failed(forbidden)
	s.failed(forbidden)
	if _, _, err := s.state(time.Now()); !apierrors.IsForbidden(err) || notified != 1 {
		t.Fatalf("after Forbidden: err %v, notified %d; want Forbidden at once, one notice", err, notified)
	}
	s.put(nil, true) // a list: the object does not exist
	if _, synced, err := s.state(time.Now()); !synced || err != nil || notified != 2 {
		t.Errorf("after a list: synced %v, err %v, notified %d; want synced, no error, notified", synced, err, notified)
	}
	s.failed(forbidden) // a later relist fails: the cache keeps what it has
	if _, synced, err := s.state(time.Now()); !synced || err != nil {
		t.Errorf("a synced store after a failed relist: synced %v, err %v; want synced, no error", synced, err)
	}
}
