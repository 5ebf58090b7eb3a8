package source

import (
	"context"
	"sync"

	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

const (
	// firstReadWorkers is how many first reads of one kind run at once.
	firstReadWorkers = 8
	// bulkMin is how many first reads of one namespace (of a cluster-scoped
	// kind: of the kind) must be waiting before they are considered for
	// one LIST instead of one GET each.
	bulkMin = 32
	// bulkShare is the least share of the kind (in the namespace) that the
	// waiting reads must make up for the LIST to be made: a node that needs
	// a tenth of all the objects it would list reads them with one LIST
	// (at most ten times the bytes of its GETs, one request instead of
	// hundreds); a node that needs fewer reads them one by one, so that no
	// fleet of agents ever lists a kind of a large cluster whole.
	bulkShare = 10
	// maxBulkTries bounds how often a batch waits for other batches' LISTs
	// of its namespace (or their choice not to list) before it reads what
	// is left one by one.
	maxBulkTries = 8
	// bulkPageSize is the page size of a bulk LIST.
	bulkPageSize = 500
)

// firstReads makes the first read of each newly referenced object. One at
// a time it is a GET, made at once, as the reflector's first list was; when
// reads pile up behind the API client's rate limit (a burst of pods, the
// pods of a node at restart) and many of them are in one namespace, and
// they are a large share of what that namespace holds, one paginated LIST
// answers them all (consistent: resourceVersion unset). What was read goes
// to the cache (byNameCache.firstRead), which watches it or, when it has
// settled, only reads it again from time to time. In GET-only mode
// (Config.GetOnly) there is no LIST: every first read is a GET, as the
// Node authorizer allows nothing else.
type firstReads struct {
	c     *byNameCache
	queue workqueue.TypedInterface[cache.ObjectName]
	// lists holds the bulk LISTs in flight, one per namespace: a batch of
	// a namespace that is being listed waits for that LIST instead of
	// making its own (at restart, every worker's batch is of the same
	// namespace).
	lists singleflight.Group
	// waiting, when set, is told that a batch waits for a LIST of the
	// namespace: its own or the one in flight that it joined (tests).
	waiting func(ns string)
}

func newFirstReads(c *byNameCache) *firstReads {
	return &firstReads{c: c, queue: workqueue.NewTyped[cache.ObjectName]()}
}

// add asks for key's first read.
func (r *firstReads) add(key cache.ObjectName) { r.queue.Add(key) }

// run reads until ctx ends. One goroutine takes the keys from the queue and
// hands them, alone or in batches, to the workers: with a single taker, the
// keys the queue's Len counts are there to take, so draining them never
// blocks. (With every worker taking, one that counted the waiting keys
// found them taken by the others and waited in Get, holding its batch
// unread until some later key arrived: at restart, never.)
func (r *firstReads) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	batches := make(chan []cache.ObjectName)
	var wg sync.WaitGroup
	for range firstReadWorkers {
		wg.Go(func() {
			for keys := range batches {
				r.read(ctx, keys)
			}
		})
	}
	for {
		keys, ok := r.take()
		if !ok {
			break
		}
		batches <- keys
	}
	close(batches)
	wg.Wait()
}

// take waits for a key and, when many more are waiting, takes those too.
// Only run calls it.
func (r *firstReads) take() ([]cache.ObjectName, bool) {
	key, shutdown := r.queue.Get()
	if shutdown {
		return nil, false
	}
	keys := []cache.ObjectName{key}
	if n := r.queue.Len(); n >= bulkMin {
		for range n {
			k, shutdown := r.queue.Get()
			if shutdown {
				break
			}
			keys = append(keys, k)
		}
	}
	return keys, true
}

// read reads keys: those of a namespace with one LIST when they are many
// and a large share of it, the others one by one.
func (r *firstReads) read(ctx context.Context, keys []cache.ObjectName) {
	defer func() {
		for _, k := range keys {
			r.queue.Done(k)
		}
	}()
	groups := map[string][]cache.ObjectName{}
	for _, k := range keys {
		// A key that another batch's LIST answered is not read again.
		if r.c.awaitsFirstRead(k) {
			groups[k.Namespace] = append(groups[k.Namespace], k)
		}
	}
	for ns, group := range groups {
		for _, k := range r.bulkShared(ctx, ns, group) {
			if !r.c.awaitsFirstRead(k) {
				continue // answered meanwhile by another batch's LIST
			}
			obj, err := r.c.lw.get(ctx, k.Namespace, k.Name)
			r.c.firstRead(ctx, k, obj, err)
		}
	}
}

// bulkShared reads keys (all of namespace ns) with one LIST when bulk
// would, or waits for the LIST of ns that another batch has in flight, and
// returns the keys left to read one by one (all of them in GET-only mode). A LIST that another batch made
// answered the keys that awaited their first read when it began; of this
// batch's keys it looked for, those it did not answer do not exist (they
// are read one by one, which starts the reflector that waits for them).
// Keys that began to await after it began were not looked for: for them
// this batch decides again, as it does when the other batch found too few
// keys awaiting for a LIST: more may await by now. (At restart the pods'
// references arrive while the first LIST is in flight; each batch that
// waited for it and read its keys one by one made thousands of GETs at the
// client's rate.)
func (r *firstReads) bulkShared(ctx context.Context, ns string, keys []cache.ObjectName) []cache.ObjectName {
	var missing []cache.ObjectName
	for range maxBulkTries {
		if len(keys) < bulkMin || r.c.getOnly {
			break
		}
		led := false
		shared := r.lists.DoChan(ns, func() (any, error) {
			led = true
			return r.bulk(ctx, ns, keys), nil
		})
		if r.waiting != nil {
			r.waiting(ns)
		}
		res := (<-shared).Val.(bulkResult)
		switch {
		case led && res.listed:
			// Every key looked for: answered, or NotFound. Those a LIST
			// shared before did not find are still to be read.
			return missing
		case led:
			return append(missing, keys...)
		case !res.listed:
			continue
		}
		var later []cache.ObjectName
		for _, k := range keys {
			switch {
			case !r.c.awaitsFirstRead(k):
				// answered by that LIST (or another read)
			case res.lookedFor(k.Name):
				missing = append(missing, k)
			default:
				later = append(later, k)
			}
		}
		keys = later
	}
	return append(missing, keys...)
}

// bulkResult is what one bulk read did.
type bulkResult struct {
	// listed tells whether the LIST was made.
	listed bool
	// wanted holds the names the LIST looked for.
	wanted map[string]runtime.Object
}

func (b bulkResult) lookedFor(name string) bool {
	_, ok := b.wanted[name]
	return ok
}

// bulk reads keys (all of namespace ns) with one paginated LIST when the
// node's objects of ns that await their first read (keys, and those that
// other batches still hold or the queue has not handed out yet) are at
// least a bulkShare-th of what ns holds, and reports whether it did and
// which names it looked for. The LIST answers all of them: at restart,
// when the pods' references arrive faster than they are read, one LIST
// serves the batches that follow. A LIST that fails reads nothing: the
// keys are then read one by one.
func (r *firstReads) bulk(ctx context.Context, ns string, keys []cache.ObjectName) bulkResult {
	logger := klog.FromContext(ctx)
	probe, err := r.c.lw.list(ctx, ns, metav1.ListOptions{Limit: 1})
	if err != nil {
		logger.V(4).Info("Counting objects for a bulk read failed; reading them one by one", "kind", r.c.kind, "namespace", ns, "err", err)
		return bulkResult{}
	}
	lm, err := meta.ListAccessor(probe)
	if err != nil {
		return bulkResult{}
	}
	total := int64(meta.LenList(probe))
	if rest := lm.GetRemainingItemCount(); rest != nil {
		total += *rest
	} else if lm.GetContinue() != "" {
		return bulkResult{} // the API server would not say how many
	}
	others := r.c.awaitingFirstRead(ns)
	if int64(max(len(keys), len(others)))*bulkShare < total {
		return bulkResult{}
	}
	want := make(map[string]runtime.Object, len(keys)+len(others))
	for _, k := range others {
		want[k.Name] = nil
	}
	for _, k := range keys {
		want[k.Name] = nil
	}
	opts := metav1.ListOptions{Limit: bulkPageSize}
	for {
		page, err := r.c.lw.list(ctx, ns, opts)
		if err != nil {
			logger.V(4).Info("Bulk read failed; reading the objects one by one", "kind", r.c.kind, "namespace", ns, "err", err)
			return bulkResult{}
		}
		if err := meta.EachListItem(page, func(obj runtime.Object) error {
			if m, err := meta.Accessor(obj); err == nil {
				if _, ok := want[m.GetName()]; ok {
					// A copy: the cache must not keep the page alive.
					want[m.GetName()] = obj.DeepCopyObject()
				}
			}
			return nil
		}); err != nil {
			return bulkResult{}
		}
		lm, err := meta.ListAccessor(page)
		if err != nil {
			return bulkResult{}
		}
		if lm.GetContinue() == "" {
			break
		}
		opts.Continue = lm.GetContinue()
	}
	logger.V(4).Info("Read objects with one LIST", "kind", r.c.kind, "namespace", ns, "objects", len(keys), "others", len(others), "of", total)
	for _, k := range keys {
		if obj := want[k.Name]; obj != nil {
			r.c.firstRead(ctx, k, obj, nil)
			continue
		}
		r.c.firstRead(ctx, k, nil, apierrors.NewNotFound(r.c.resource, k.Name))
	}
	// The others found are answered now; those not found are left to their
	// own read, which starts the reflector that waits for them.
	for _, k := range others {
		if obj := want[k.Name]; obj != nil && r.c.awaitsFirstRead(k) {
			r.c.firstRead(ctx, k, obj, nil)
		}
	}
	return bulkResult{listed: true, wanted: want}
}
