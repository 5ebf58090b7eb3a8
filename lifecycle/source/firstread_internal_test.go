package source

import (
	"context"
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
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// TestBulkFirstRead: many first reads of one namespace that make up a large
// share of it are answered by one LIST (found objects cached, missing ones
// NotFound); a small share is not listed.
func TestBulkFirstRead(t *testing.T) {
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	objs := claimObjects(50, "c-%02d")
	client := fake.NewClientset(objs...)
	var (
		lists atomic.Int32
		mu    sync.Mutex
		gets  []string
	)
	client.PrependReactor("list", "persistentvolumeclaims", func(k8stesting.Action) (bool, kruntime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	client.PrependReactor("get", "persistentvolumeclaims", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		gets = append(gets, a.(k8stesting.GetAction).GetName())
		return false, nil, nil
	})
	core := client.CoreV1()
	c := settledClaimCache(claimListWatch(core), func(cache.ObjectName) {})

	// 40 of the 50 claims exist among 45 wanted: a LIST answers them.
	var keys []cache.ObjectName
	for i := 10; i < 55; i++ {
		k := cache.ObjectName{Namespace: "ns", Name: fmt.Sprintf("c-%02d", i)}
		keys = append(keys, k)
		c.watch(k)
	}
	r := newFirstReads(c)
	if !r.bulk(ctx, "ns", keys).listed {
		t.Fatal("bulk read of 45 of 50 claims not made")
	}
	// The reflectors of the missing claims may GET them; nothing else.
	mu.Lock()
	for _, name := range gets {
		if name < "c-50" {
			t.Errorf("claim %s read with a GET besides the LIST", name)
		}
	}
	mu.Unlock()
	for _, k := range keys[:40] {
		if obj, err := c.get(k); err != nil || obj == nil {
			t.Errorf("claim %s after the bulk read: %v, %v", k, obj, err)
		}
	}
	// The missing five start their reflectors, which wait for them.
	for _, k := range keys[40:] {
		c.mu.Lock()
		started := c.items[k].cancel != nil
		c.mu.Unlock()
		if !started {
			t.Errorf("missing claim %s: no reflector started to wait for it", k)
		}
	}

	// 32 wanted of a namespace of 400: read one by one.
	for i := 50; i < 400; i++ {
		if _, err := core.PersistentVolumeClaims("ns").Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: fmt.Sprintf("c-%02d", i)}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	before := lists.Load()
	if r.bulk(ctx, "ns", keys[:32]).listed {
		t.Error("bulk read made for 32 of 400 claims")
	}
	if n := lists.Load() - before; n != 1 {
		t.Errorf("%d LISTs for the small share, want only the count", n)
	}
	c.mu.Lock()
	for _, item := range c.items {
		if item.cancel != nil {
			item.cancel()
		}
	}
	c.mu.Unlock()
}

// TestFirstReadsOfABurstAllComplete: keys that arrive at once (the pods of
// a node at restart) are all read, however the workers share them out. A
// worker that took a batch once waited in the queue's Get for keys that
// other workers had taken meanwhile, holding the keys it had, unread, until
// some later key arrived: at restart, with nothing arriving later, the
// agent never became ready.
func TestFirstReadsOfABurstAllComplete(t *testing.T) {
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig())))
	defer cancel()
	pvc := func(ns, name string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "3"}}
	}
	// read is told each claim read (the cache's change callback).
	read := make(chan cache.ObjectName, 300)
	c := newByNameCache(KindPersistentVolumeClaim, resourceOf(KindPersistentVolumeClaim), &corev1.PersistentVolumeClaim{},
		listWatchFuncs{
			get: func(_ context.Context, ns, name string) (kruntime.Object, error) {
				return pvc(ns, name), nil
			},
			// The namespaces are large: every batch is read one by one.
			list: func(context.Context, string, metav1.ListOptions) (kruntime.Object, error) {
				more := int64(1 << 20)
				return &corev1.PersistentVolumeClaimList{ListMeta: metav1.ListMeta{RemainingItemCount: &more, Continue: "x"}}, nil
			},
			watch: func(context.Context, string, metav1.ListOptions) (watch.Interface, error) {
				return watch.NewFake(), nil
			},
			newList: func() kruntime.Object { return &corev1.PersistentVolumeClaimList{} },
		}, func(k cache.ObjectName) { read <- k })
	c.settling = newSettling(KindPersistentVolumeClaim, time.Hour)
	c.settling.settled = func(kruntime.Object) bool { return true }
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	for round := range 5 {
		unread := map[cache.ObjectName]bool{}
		for i := range 300 {
			k := cache.ObjectName{Namespace: fmt.Sprintf("ns-%d", i%4), Name: fmt.Sprintf("r%d-c%d", round, i)}
			unread[k] = true
			c.watch(k)
		}
		timeout := time.After(20 * time.Second)
		for len(unread) > 0 {
			select {
			case k := <-read:
				delete(unread, k)
			case <-timeout:
				t.Fatalf("round %d: %d claims never read", round, len(unread))
			}
		}
	}
	cancel()
	<-done
}

// TestBulkFirstReadAnswersEveryKeyAwaitingIt: at restart the pods'
// references arrive faster than they are read, so a batch holds only a
// part of them. The LIST is made when all the node's keys of the namespace
// awaiting their first read are a large share of it, and answers them all,
// not only the batch's.
func TestBulkFirstReadAnswersEveryKeyAwaitingIt(t *testing.T) {
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	objs := claimObjects(400, "c-%03d")
	client := fake.NewClientset(objs...)
	var gets, lists atomic.Int32
	client.PrependReactor("get", "persistentvolumeclaims", func(k8stesting.Action) (bool, kruntime.Object, error) {
		gets.Add(1)
		return false, nil, nil
	})
	client.PrependReactor("list", "persistentvolumeclaims", func(k8stesting.Action) (bool, kruntime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	core := client.CoreV1()
	c := settledClaimCache(claimListWatch(core), func(cache.ObjectName) {})
	// 100 of the namespace's 400 claims await their first read; a batch
	// of 32 of them (alone, a twelfth of the namespace) comes first.
	var keys []cache.ObjectName
	for i := range 100 {
		k := cache.ObjectName{Namespace: "ns", Name: fmt.Sprintf("c-%03d", i)}
		keys = append(keys, k)
		c.watch(k)
	}
	r := newFirstReads(c)
	if !r.bulk(ctx, "ns", keys[:32]).listed {
		t.Fatal("no LIST for 32 claims while 100 of 400 await their first read")
	}
	for _, k := range keys {
		if obj, err := c.get(k); err != nil || obj == nil {
			t.Errorf("claim %s after the LIST: %v, %v", k, obj, err)
		}
	}
	// The batches that follow find their keys answered: no GET, no LIST.
	before := lists.Load()
	r.read(ctx, keys[32:])
	if n := gets.Load(); n != 0 {
		t.Errorf("%d GETs after the LIST answered every claim", n)
	}
	if n := lists.Load() - before; n != 0 {
		t.Errorf("%d LISTs after the LIST answered every claim", n)
	}
}

// TestBatchesOfANamespaceShareItsList: at restart every worker holds a
// batch of the same namespace; a batch that arrives while that namespace
// is being listed waits for the LIST in flight instead of making its own
// (each of them listed the whole namespace once, so that eight workers
// read it eight times over).
func TestBatchesOfANamespaceShareItsList(t *testing.T) {
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	objs := claimObjects(100, "c-%03d")
	core := fake.NewClientset(objs...).CoreV1()
	lw := claimListWatch(core)
	// The first full LIST (not the count, Limit 1) is held open until a
	// second one starts or, as it should be, none has started in 2 s.
	var fullLists atomic.Int32
	second := make(chan struct{})
	list := lw.list
	lw.list = func(ctx context.Context, ns string, o metav1.ListOptions) (kruntime.Object, error) {
		if o.Limit != 1 {
			switch fullLists.Add(1) {
			case 1:
				select {
				case <-second:
				case <-time.After(2 * time.Second):
				}
			case 2:
				close(second)
			}
		}
		return list(ctx, ns, o)
	}
	c := settledClaimCache(lw, func(cache.ObjectName) {})
	keys := watchClaims(c, 100, "c-%03d")
	r := newFirstReads(c)
	var wg sync.WaitGroup
	for b := range 3 {
		wg.Go(func() { r.read(ctx, keys[b*33:(b+1)*33]) })
	}
	wg.Wait()
	if n := fullLists.Load(); n != 1 {
		t.Errorf("the namespace was listed %d times by three batches read at once, want once", n)
	}
	requireCached(t, c, keys, "after the batches")
}

// TestABatchListsWhenTheListItWaitedForFailed: a batch that waited for
// another batch's LIST of its namespace, which failed, makes its own LIST
// instead of reading its keys one GET at a time (with the batches of a
// restart that share one failed LIST, thousands of GETs at the client's
// rate).
func TestABatchListsWhenTheListItWaitedForFailed(t *testing.T) {
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	core := fake.NewClientset(claimObjects(100, "c-%03d")...).CoreV1()
	lw := claimListWatch(core)
	gotten := recordGets(&lw)
	var fullLists atomic.Int32
	// The first full LIST is held open until a second one starts or 2 s
	// passed, and then fails.
	leaderListing, second := make(chan struct{}), make(chan struct{})
	list := lw.list
	lw.list = func(ctx context.Context, ns string, o metav1.ListOptions) (kruntime.Object, error) {
		if o.Limit != 1 {
			switch fullLists.Add(1) {
			case 1:
				close(leaderListing)
				select {
				case <-second:
				case <-time.After(2 * time.Second):
				}
				return nil, apierrors.NewTimeoutError("the list took too long", 1)
			case 2:
				close(second)
			}
		}
		return list(ctx, ns, o)
	}
	c := settledClaimCache(lw, func(cache.ObjectName) {})
	keys := watchClaims(c, 100, "c-%03d")
	r := newFirstReads(c)
	var wg sync.WaitGroup
	wg.Go(func() { r.read(ctx, keys[:40]) })
	<-leaderListing
	wg.Go(func() { r.read(ctx, keys[40:]) })
	wg.Wait()
	for _, k := range keys[40:] {
		if gotten(k.Name) {
			t.Errorf("claim %s read with a GET after the LIST its batch waited for failed; want a LIST of its own", k.Name)
		}
	}
	requireCached(t, c, keys, "after the batches")
}

// recordGets makes lw's get record the names it reads; gotten tells whether
// name was read with a GET.
func recordGets(lw *listWatchFuncs) (gotten func(name string) bool) {
	var (
		mu   sync.Mutex
		gets = map[string]bool{}
	)
	get := lw.get
	lw.get = func(ctx context.Context, ns, name string) (kruntime.Object, error) {
		mu.Lock()
		gets[name] = true
		mu.Unlock()
		return get(ctx, ns, name)
	}
	return func(name string) bool {
		mu.Lock()
		defer mu.Unlock()
		return gets[name]
	}
}

// claimListWatch gets, lists and watches claims through core.
func claimListWatch(core corev1client.CoreV1Interface) listWatchFuncs {
	return listWatchFuncs{
		get: func(ctx context.Context, ns, name string) (kruntime.Object, error) {
			return core.PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		},
		list: func(ctx context.Context, ns string, o metav1.ListOptions) (kruntime.Object, error) {
			return core.PersistentVolumeClaims(ns).List(ctx, o)
		},
		watch: func(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
			return core.PersistentVolumeClaims(ns).Watch(ctx, o)
		},
		newList: func() kruntime.Object { return &corev1.PersistentVolumeClaimList{} },
	}
}

// claimObjects returns n claims of namespace "ns" named by format.
func claimObjects(n int, format string) []kruntime.Object {
	objs := make([]kruntime.Object, 0, n)
	for i := range n {
		objs = append(objs, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: fmt.Sprintf(format, i), ResourceVersion: "3"}})
	}
	return objs
}

// settledClaimCache returns a claim cache reading through lw whose every
// object settles on its first read: nothing is left to watch.
func settledClaimCache(lw listWatchFuncs, changed func(cache.ObjectName)) *byNameCache {
	c := newByNameCache(KindPersistentVolumeClaim, resourceOf(KindPersistentVolumeClaim), &corev1.PersistentVolumeClaim{}, lw, changed)
	c.settling = newSettling(KindPersistentVolumeClaim, time.Hour)
	c.settling.settled = func(kruntime.Object) bool { return true }
	return c
}

// watchClaims references n claims of namespace "ns" named by format in c.
func watchClaims(c *byNameCache, n int, format string) []cache.ObjectName {
	keys := make([]cache.ObjectName, 0, n)
	for i := range n {
		k := cache.ObjectName{Namespace: "ns", Name: fmt.Sprintf(format, i)}
		keys = append(keys, k)
		c.watch(k)
	}
	return keys
}

// requireCached fails t for each of keys that c does not hold.
func requireCached(t *testing.T, c *byNameCache, keys []cache.ObjectName, when string) {
	t.Helper()
	for _, k := range keys {
		if obj, err := c.get(k); err != nil || obj == nil {
			t.Errorf("claim %s %s: %v, %v", k, when, obj, err)
		}
	}
}

// TestKeysThatArriveDuringAListAreListedAgain: a batch that waited for
// another batch's LIST of its namespace, whose keys began to await their
// first read after that LIST began (so it did not look for them), decides
// again and lists them, instead of reading them one GET at a time as if
// the LIST had not found them. At restart the pods' references arrive
// while the first LIST is in flight: a 5,000-volume restart made thousands
// of GETs at the client's rate and took 30 s.
func TestKeysThatArriveDuringAListAreListedAgain(t *testing.T) {
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	core := fake.NewClientset(claimObjects(100, "c-%03d")...).CoreV1()
	lw := claimListWatch(core)
	gotten := recordGets(&lw)
	var fullLists atomic.Int32
	// The first full LIST is held open until released. (A LIST by name is
	// the reflector of a missing claim.)
	leaderListing, release := make(chan struct{}), make(chan struct{})
	list := lw.list
	lw.list = func(ctx context.Context, ns string, o metav1.ListOptions) (kruntime.Object, error) {
		if o.Limit != 1 && o.FieldSelector == "" && fullLists.Add(1) == 1 {
			close(leaderListing)
			<-release
		}
		return list(ctx, ns, o)
	}
	c := settledClaimCache(lw, func(cache.ObjectName) {})
	first := watchClaims(c, 40, "c-%03d")
	// A claim that does not exist is referenced before the LIST too; its
	// key is in the later batch, which must still read it (the LIST looked
	// for it and did not find it): a GET, which starts the reflector that
	// waits for it.
	absent := cache.ObjectName{Namespace: "ns", Name: "absent"}
	c.watch(absent)
	r := newFirstReads(c)
	batchesWaiting := make(chan struct{}, maxBulkTries)
	r.waiting = func(string) {
		select {
		case batchesWaiting <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { r.read(ctx, first) })
	<-leaderListing
	// The other 60 claims are referenced while the LIST is in flight, and
	// their batch waits for it.
	later := []cache.ObjectName{absent}
	for i := 40; i < 100; i++ {
		k := cache.ObjectName{Namespace: "ns", Name: fmt.Sprintf("c-%03d", i)}
		later = append(later, k)
		c.watch(k)
	}
	wg.Go(func() { r.read(ctx, later) })
	// Released once both batches wait for it: the second one joined it.
	<-batchesWaiting
	<-batchesWaiting
	close(release)
	wg.Wait()
	for _, k := range later[1:] {
		if gotten(k.Name) {
			t.Errorf("claim %s read with a GET: the LIST its batch waited for had not looked for it; want a LIST", k.Name)
		}
	}
	if n := fullLists.Load(); n != 2 {
		t.Errorf("%d full LISTs, want 2: the first batch's and the one of the claims referenced during it", n)
	}
	requireCached(t, c, append(first, later[1:]...), "after the batches")
	if !gotten(absent.Name) {
		t.Errorf("claim %s, looked for and not found by the first LIST, was not read by its batch", absent.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.items[absent].cancel == nil {
		t.Errorf("claim %s: no reflector started to wait for it", absent.Name)
	}
	for _, item := range c.items {
		if item.cancel != nil {
			item.cancel()
		}
	}
}
