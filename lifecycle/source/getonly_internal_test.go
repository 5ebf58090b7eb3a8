package source

import (
	"context"
	"errors"
	"fmt"
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

// TestGetOnlyFirstReadsNeverList: the batch that outside GET-only mode is
// one LIST (TestBulkFirstRead: 45 wanted of a namespace of 50) is read
// with one GET per claim in GET-only mode; the missing claims are cached as
// missing and polled, no reflector started.
func TestGetOnlyFirstReadsNeverList(t *testing.T) {
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	client := fake.NewClientset(claimObjects(50, "c-%02d")...)
	var lists, gets atomic.Int32
	client.PrependReactor("list", "persistentvolumeclaims", func(k8stesting.Action) (bool, kruntime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	client.PrependReactor("get", "persistentvolumeclaims", func(k8stesting.Action) (bool, kruntime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	c := settledClaimCache(claimListWatch(client.CoreV1()), func(cache.ObjectName) {})
	c.getOnly = true
	t.Cleanup(c.settling.queue.ShutDown)
	var keys []cache.ObjectName
	for i := 10; i < 55; i++ {
		k := cache.ObjectName{Namespace: "ns", Name: fmt.Sprintf("c-%02d", i)}
		keys = append(keys, k)
		c.watch(k)
	}
	newFirstReads(c).read(ctx, keys)
	if n := lists.Load(); n != 0 {
		t.Errorf("%d LISTs in GET-only mode, want none", n)
	}
	if n := gets.Load(); n != int32(len(keys)) {
		t.Errorf("%d GETs for %d claims, want one each", n, len(keys))
	}
	requireCached(t, c, keys[:40], "after the first reads")
	for _, k := range keys[40:] {
		if _, err := c.get(k); !apierrors.IsNotFound(err) {
			t.Errorf("missing claim %s: %v, want NotFound", k, err)
		}
		c.mu.Lock()
		item := c.items[k]
		if item.cancel != nil || item.poll != pollFirst {
			t.Errorf("missing claim %s: reflector %v, next poll in %v; want no reflector, a poll in %v", k, item.cancel != nil, item.poll, pollFirst)
		}
		c.mu.Unlock()
	}
	if w, _ := c.stats(); w != 0 {
		t.Errorf("stats: %d watches in GET-only mode, want 0", w)
	}
}

// TestGetOnlyPollSchedule: an object that is not settled is polled 500 ms
// after its read, then twice as long after each read that changed
// nothing, up to 8 s, and 500 ms after one that changed it; each delay is
// at most 10 % longer.
func TestGetOnlyPollSchedule(t *testing.T) {
	c := newByNameCache(KindVolumeAttachment, resourceOf(KindVolumeAttachment), nil, listWatchFuncs{}, func(cache.ObjectName) {})
	c.settling = newSettling(KindVolumeAttachment, time.Hour)
	c.getOnly = true
	t.Cleanup(c.settling.queue.ShutDown)
	key := cache.ObjectName{Name: "va"}
	c.watch(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	item := c.items[key]
	for i, step := range []struct {
		changed bool
		want    time.Duration
	}{
		{false, 500 * time.Millisecond}, {false, time.Second}, {false, 2 * time.Second}, {false, 4 * time.Second},
		{false, 8 * time.Second}, {false, 8 * time.Second}, {true, 500 * time.Millisecond}, {false, time.Second},
	} {
		c.pollLocked(key, item, step.changed)
		if item.poll != step.want || item.settled {
			t.Errorf("poll %d (changed %v): interval %v, settled %v; want %v, not settled", i, step.changed, item.poll, item.settled, step.want)
		}
	}
	if longest := time.Duration(float64(pollMax) * (1 + pollJitter)); longest > 9*time.Second {
		t.Errorf("a change may take %v to be seen", longest)
	}
}

// TestSettledClaimsAreReadAgainWithinAMinute: a settled claim is read
// again within [45 s, 75 s] (1 min ± 25 %) of its last read whatever
// longer SettledObjectResync is set, at SettledObjectResync ± 25 % when it
// is shorter; volumes and attachments at SettledObjectResync ± 50 %.
func TestSettledClaimsAreReadAgainWithinAMinute(t *testing.T) {
	for _, tc := range []struct {
		kind     Kind
		period   time.Duration
		min, max time.Duration
	}{
		{KindPersistentVolumeClaim, 2 * time.Minute, 45 * time.Second, 75 * time.Second},
		{KindPersistentVolumeClaim, time.Hour, 45 * time.Second, 75 * time.Second},
		{KindPersistentVolumeClaim, 40 * time.Second, 30 * time.Second, 50 * time.Second},
		{KindPersistentVolume, 2 * time.Minute, time.Minute, 3 * time.Minute},
		{KindVolumeAttachment, 2 * time.Minute, time.Minute, 3 * time.Minute},
	} {
		s := newSettling(tc.kind, tc.period)
		lo, hi := time.Duration(1<<62), time.Duration(0)
		var sum time.Duration
		const n = 2000
		for range n {
			d := s.delay()
			lo, hi, sum = min(lo, d), max(hi, d), sum+d
		}
		s.queue.ShutDown()
		if lo < tc.min || hi > tc.max {
			t.Errorf("%s, SettledObjectResync %v: read again after %v to %v, want within [%v, %v]", tc.kind, tc.period, lo, hi, tc.min, tc.max)
		}
		// Spread over the range, not stuck at one end.
		span := tc.max - tc.min
		if lo > tc.min+span/10 || hi < tc.max-span/10 {
			t.Errorf("%s, SettledObjectResync %v: delays %v to %v do not spread over [%v, %v]", tc.kind, tc.period, lo, hi, tc.min, tc.max)
		}
		if mean, mid := sum/n, (tc.min+tc.max)/2; mean < mid-span/20 || mean > mid+span/20 {
			t.Errorf("%s, SettledObjectResync %v: mean delay %v, want about %v", tc.kind, tc.period, mean, mid)
		}
	}
}

// TestGetOnlyForbiddenClaimOrVolumeMayPass: in GET-only mode a volume's
// Forbidden (the Node authorizer's graph lagging behind a binding) is an
// error that may pass: the volume reads as not synced, its readers are not
// told, and a read that succeeds within unreadableAfter caches it as if
// nothing had failed. Forbidden for unreadableAfter, it is unreadable: the
// readers are told once, the reads go on, and a read that succeeds ends
// it.
func TestGetOnlyForbiddenClaimOrVolumeMayPass(t *testing.T) {
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig())))
	pv := func(name string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
			Spec:   corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: "c"}},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
	}
	var (
		mu       sync.Mutex
		forbid   = map[string]bool{"lagging": true, "denied": true}
		failures = map[string]int{}
		told     = map[string]int{}
	)
	lw := listWatchFuncs{
		get: func(_ context.Context, _, name string) (kruntime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if forbid[name] {
				failures[name]++
				return nil, apierrors.NewForbidden(resourceOf(KindPersistentVolume), name, errors.New("no relationship found between node and this object"))
			}
			return pv(name), nil
		},
		list: func(context.Context, string, metav1.ListOptions) (kruntime.Object, error) {
			t.Error("LIST in GET-only mode")
			return nil, errors.New("no LIST")
		},
		watch: func(context.Context, string, metav1.ListOptions) (watch.Interface, error) {
			t.Error("WATCH in GET-only mode")
			return nil, errors.New("no WATCH")
		},
		newList: func() kruntime.Object { return &corev1.PersistentVolumeList{} },
	}
	c := newByNameCache(KindPersistentVolume, resourceOf(KindPersistentVolume), &corev1.PersistentVolume{}, lw, func(k cache.ObjectName) {
		mu.Lock()
		defer mu.Unlock()
		told[k.Name]++
	})
	c.settling = newSettling(KindPersistentVolume, time.Hour)
	c.getOnly = true
	lagging, denied := cache.ObjectName{Name: "lagging"}, cache.ObjectName{Name: "denied"}
	c.watch(lagging)
	c.watch(denied)
	done := make(chan struct{})
	go func() { defer close(done); c.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	count := func(m map[string]int, name string) int {
		mu.Lock()
		defer mu.Unlock()
		return m[name]
	}
	waitUntil(t, "three Forbidden reads of each", func() bool {
		return count(failures, "lagging") >= 3 && count(failures, "denied") >= 3
	})
	for _, k := range []cache.ObjectName{lagging, denied} {
		if _, err := c.get(k); !errors.Is(err, ErrNotSynced) {
			t.Errorf("%s after %d Forbidden reads: %v, want ErrNotSynced", k, count(failures, k.Name), err)
		}
		if n := count(told, k.Name); n != 0 {
			t.Errorf("%s: readers told %d times while its reads may pass", k, n)
		}
	}

	// The lagging volume becomes readable: cached, readers told. (The
	// test reads at once what the poll would read within 8.8 s.)
	mu.Lock()
	forbid["lagging"] = false
	mu.Unlock()
	c.settling.queue.Add(lagging)
	waitUntil(t, "the lagging volume cached", func() bool { obj, err := c.get(lagging); return err == nil && obj != nil })
	if n := count(told, "lagging"); n != 1 {
		t.Errorf("lagging: readers told %d times, want once (cached)", n)
	}

	// The other has been Forbidden for unreadableAfter: its next read
	// makes it unreadable.
	c.mu.Lock()
	s := c.items[denied].store
	c.mu.Unlock()
	s.mu.Lock()
	s.failingSince = s.failingSince.Add(-unreadableAfter)
	s.mu.Unlock()
	c.settling.queue.Add(denied)
	waitUntil(t, "the denied volume unreadable", func() bool { _, err := c.get(denied); return apierrors.IsForbidden(err) })
	waitUntil(t, "the readers told", func() bool { return count(told, "denied") == 1 })
	polled := count(failures, "denied")
	c.settling.queue.Add(denied)
	waitUntil(t, "read again", func() bool { return count(failures, "denied") > polled })
	if n := count(told, "denied"); n != 1 {
		t.Errorf("denied: readers told %d times while unreadable, want once", n)
	}
	mu.Lock()
	forbid["denied"] = false
	mu.Unlock()
	c.settling.queue.Add(denied)
	waitUntil(t, "the denied volume readable again", func() bool { obj, err := c.get(denied); return err == nil && obj != nil })
	if n := count(told, "denied"); n != 2 {
		t.Errorf("denied: readers told %d times, want twice (unreadable, then cached)", n)
	}
}

// waitUntil polls cond every 10 ms for up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
