package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// hangingPodLists makes the clientset's pod LISTs, while down is set, hang
// as an unreachable API server's do until the client's timeout (the
// check's 5 s) and then fail; it counts them and the most in flight at
// once.
type hangingPodLists struct {
	down            atomic.Bool
	lists, inFlight atomic.Int32
	maxInFlight     atomic.Int32
	// hang is how long a LIST hangs before it fails, in nanoseconds.
	hang atomic.Int64
	ctx  context.Context
}

func (h *hangingPodLists) react(k8stesting.Action) (bool, runtime.Object, error) {
	if !h.down.Load() {
		return false, nil, nil
	}
	h.lists.Add(1)
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for {
		m := h.maxInFlight.Load()
		if n <= m || h.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-time.After(time.Duration(h.hang.Load())):
	case <-h.ctx.Done():
	}
	return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
}

// TestOutageDoesNotHoldVolumeWorkers is issue 23's defect 4: during an API
// server outage every volume waiting to be unstaged asks, every 100 ms,
// whether the pod cache is current, which is a LIST of the node's pods.
// With 8 unstages pending (the default 8 volume workers) and a LIST that
// hangs until its timeout, the workers must not wait behind it: a volume
// of a new pod is staged at once, one LIST at a time is in flight for the
// whole node, failed LISTs are backed off, and once the API server is back
// the unstages proceed.
func TestOutageDoesNotHoldVolumeWorkers(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset()
	lists := &hangingPodLists{ctx: ctx}
	lists.hang.Store(int64(5 * time.Second))
	client.PrependReactor("list", "pods", lists.react)
	src, err := source.New(ctx, source.Config{Client: client, NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	srcDone := make(chan struct{})
	go func() { defer close(srcDone); src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-srcDone })
	eventually(t, "source synced", src.HasSynced)

	h := newHarness(t, func(c *Config) { c.Settled = func() bool { return src.PodsCurrent(ctx) } })
	close(h.synced)
	const pending = 8
	var unstages []string
	for i := range pending {
		uid := fmt.Sprintf("old-%d", i)
		src := pvSource(uid)
		h.setPod(types.UID(uid), src)
		unstages = append(unstages, "unstage "+string(volume.PersistentName(testDriver, src.Handle)))
	}
	eventually(t, "old pods published", func() bool {
		n := 0
		for _, c := range h.ops.history() {
			if len(c) > 8 && c[:8] == "publish " {
				n++
			}
		}
		return n == pending
	})

	// The outage: the pods go, and their volumes wait to be unstaged.
	lists.down.Store(true)
	outage := time.Now()
	for i := range pending {
		h.desired.DeletePod(types.UID(fmt.Sprintf("old-%d", i)))
	}
	eventually(t, "old pods unpublished and a check of the pod cache in flight", func() bool {
		n := 0
		for _, c := range h.ops.history() {
			if len(c) > 10 && c[:10] == "unpublish " {
				n++
			}
		}
		return n == pending && lists.inFlight.Load() == 1
	})
	time.Sleep(time.Second) // the unstages ask again and again

	// A new pod's volume is staged and published without waiting for the
	// LIST in flight (which hangs for 5 s).
	began := time.Now()
	fresh := pvSource("fresh")
	h.setPod("new", fresh)
	name := string(volume.PersistentName(testDriver, "fresh"))
	eventually(t, "new pod's volume published", func() bool {
		return slices.Contains(h.ops.history(), "publish "+name+"@new")
	})
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("the new pod's volume was staged and published %v after its pod arrived, with %d unstages pending in an outage; want no wait behind the LIST of pods",
			took, pending)
	}
	for _, c := range h.ops.history() {
		if slices.Contains(unstages, c) {
			t.Errorf("%s during the outage: the pod cache was not known to be current", c)
		}
	}

	// Let a few LISTs fail: one at a time, spaced out.
	time.Sleep(11 * time.Second)
	n, span := lists.lists.Load(), time.Since(outage)
	if m := lists.maxInFlight.Load(); m != 1 {
		t.Errorf("at most %d LISTs of pods in flight at once, want 1", m)
	}
	// Each hangs 5 s; the checks follow one another, a failure's backoff
	// apart: no more than one per 5 s, plus the one in flight.
	if limit := int32(span/(5*time.Second)) + 1; n > limit {
		t.Errorf("%d LISTs of pods in %v of outage, want at most %d", n, span.Round(time.Second), limit)
	}
	t.Logf("%d LISTs of pods in %v of outage with %d unstages pending", n, span.Round(time.Second), pending)

	// LISTs that fail at once (connection refused) are backed off too:
	// not one per unstage every 100 ms, eating the client's QPS.
	eventually(t, "the hanging LIST ended", func() bool { return lists.inFlight.Load() == 0 })
	lists.hang.Store(0)
	lists.lists.Store(0)
	time.Sleep(3 * time.Second)
	if n := lists.lists.Load(); n > 8 {
		t.Errorf("%d LISTs of pods in 3 s of an outage where each fails at once, with %d unstages pending; want a few, backed off",
			n, pending)
	} else {
		t.Logf("%d LISTs of pods in 3 s of an outage where each fails at once", n)
	}
	lists.down.Store(false)

	// Back: the unstages proceed.
	eventually(t, "unstages after the outage", func() bool {
		got := 0
		for _, c := range h.ops.history() {
			if slices.Contains(unstages, c) {
				got++
			}
		}
		return got == pending
	})
}
