package source

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// TestObjectStore drives the store of one by-name watch the way a
// reflector does and counts the change notifications.
func TestObjectStore(t *testing.T) {
	key := cache.ObjectName{Namespace: "ns", Name: "data"}
	claim := func(name, rv string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	}
	notified := 0
	s := newObjectStore(key, func() { notified++ })
	step := func(what string, do func() error, wantNotified int, wantRV string, wantSynced bool) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if notified != wantNotified {
			t.Errorf("%s: %d notifications in total, want %d", what, notified, wantNotified)
		}
		obj, synced := s.get()
		if synced != wantSynced || resourceVersion(obj) != wantRV {
			t.Errorf("%s: stored rv %q synced %v, want %q %v", what, resourceVersion(obj), synced, wantRV, wantSynced)
		}
	}

	step("add before the first list", func() error { return s.Add(claim("data", "1")) }, 0, "1", false)
	step("first list, empty", func() error { return s.Replace(nil, "5") }, 1, "", true)
	step("others are ignored", func() error { return s.Add(claim("other", "6")) }, 1, "", true)
	step("created", func() error { return s.Add(claim("data", "7")) }, 2, "7", true)
	step("resync echo", func() error { return s.Update(claim("data", "7")) }, 2, "7", true)
	step("updated", func() error { return s.Update(claim("data", "8")) }, 3, "8", true)
	step("relist, unchanged", func() error { return s.Replace([]any{claim("other", "9"), claim("data", "8")}, "9") }, 3, "8", true)
	step("deletion of another", func() error { return s.Delete(claim("other", "9")) }, 3, "8", true)
	step("deleted (final state unknown)", func() error {
		return s.Delete(cache.DeletedFinalStateUnknown{Key: "ns/data", Obj: claim("data", "8")})
	}, 4, "", true)
	step("relist, recreated", func() error { return s.Replace([]any{claim("data", "10")}, "10") }, 5, "10", true)

	obj, _ := s.get()
	if m := obj.(*corev1.PersistentVolumeClaim).ManagedFields; m != nil {
		t.Errorf("managedFields kept in the cache: %v", m)
	}
}

// TestByNameFirstListIsGet: a by-name watch reads its object with a GET
// and watches from the object's resourceVersion; when the API server says
// that version is too old for its watch cache (410), the reflector relists
// with a LIST and later changes still arrive.
func TestByNameFirstListIsGet(t *testing.T) {
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	client := fake.NewClientset(&corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", ResourceVersion: "7"},
	})
	var (
		mu      sync.Mutex
		actions []string
	)
	record := func(a k8stesting.Action) {
		mu.Lock()
		defer mu.Unlock()
		what := a.GetVerb()
		if what != "get" && what != "list" && what != "watch" {
			return // the test's own update
		}
		if w, ok := a.(k8stesting.WatchAction); ok {
			what += "@" + w.GetWatchRestrictions().ResourceVersion
		}
		actions = append(actions, what)
	}
	client.PrependReactor("*", "persistentvolumeclaims", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		record(a)
		return false, nil, nil
	})
	var watches atomic.Int32
	client.PrependWatchReactor("persistentvolumeclaims", func(a k8stesting.Action) (bool, watch.Interface, error) {
		record(a)
		if watches.Add(1) == 1 {
			return true, nil, apierrors.NewResourceExpired("too old resource version: 7 (100)")
		}
		return false, nil, nil
	})
	changed := make(chan struct{}, 10)
	core := client.CoreV1()
	c := newByNameCache(KindPersistentVolumeClaim, resourceOf(KindPersistentVolumeClaim), &corev1.PersistentVolumeClaim{},
		claimListWatch(core), func(cache.ObjectName) { changed <- struct{}{} })
	key := cache.ObjectName{Namespace: "ns", Name: "data"}
	c.watch(key)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	waitRV := func(what, rv string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			if obj, err := c.get(key); err == nil && resourceVersion(obj) == rv {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				obj, err := c.get(key)
				t.Fatalf("%s: cached %v (rv %q), err %v; want rv %q", what, obj, resourceVersion(obj), err, rv)
			}
		}
	}
	waitRV("first list", "7")
	mu.Lock()
	first := actions[0]
	mu.Unlock()
	if first != "get" {
		t.Errorf("first request = %q, want a GET of the object", first)
	}

	// The first watch fails with 410; the reflector relists, and an update
	// made meanwhile arrives through that LIST or the watch after it.
	upd := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", ResourceVersion: "9"}}
	if _, err := core.PersistentVolumeClaims("ns").Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRV("update after the relist", "9")

	mu.Lock()
	defer mu.Unlock()
	want := []string{"get", "watch@7", "list"}
	if len(actions) < len(want) {
		t.Fatalf("requests = %v, want them to begin with %v", actions, want)
	}
	for i, w := range want {
		if !strings.HasPrefix(actions[i], w) {
			t.Errorf("request %d = %q, want %q (all: %v)", i, actions[i], w, actions)
		}
	}
}
