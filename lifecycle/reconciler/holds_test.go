package reconciler

import (
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// fakeHolds holds the pods it is told to, and counts the questions.
type fakeHolds struct {
	mu    sync.Mutex
	held  map[types.UID]bool
	asked map[types.UID]int
}

var _ RuntimeHolds = &fakeHolds{}

func (f *fakeHolds) Held(uid types.UID) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked[uid]++
	return "waiting for the runtime", f.held[uid]
}

func (f *fakeHolds) set(uid types.UID, held bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held[uid] = held
}

func (f *fakeHolds) askedFor(uid types.UID) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[uid]
}

// TestHeldPodKeepsItsVolumeUntilReleased: a pod that left the desired
// state while its runtime holds it keeps its publish (and so its stage),
// without retries, until the runtime releases it; a publish found on disk
// for a pod the desired state never had is held the same way.
func TestHeldPodKeepsItsVolumeUntilReleased(t *testing.T) {
	holds := &fakeHolds{held: map[types.UID]bool{"p1": true, "disk": true}, asked: map[types.UID]int{}}
	h := newHarness(t, func(c *Config) { c.Holds = holds })
	src := pvSource("h1")
	name := volume.PersistentName(testDriver, "h1")
	// A publish reconstructed at start, of a pod not in the desired state.
	diskKey := volume.PodKey{Volume: name, Pod: "disk"}
	h.actual.AddReconstructedPod(diskKey, src.ID, "/target/disk")
	close(h.synced)
	h.setPod("p1", src)
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1")

	key := volume.PodKey{Volume: name, Pod: "p1"}
	h.desired.DeletePod("p1")
	eventually(t, "the held pod asked for", func() bool { return holds.askedFor("p1") > 0 && holds.askedFor("disk") > 0 })
	// The deletion's events may hand the key over a few more times (the
	// volume's teardown enqueues its publishers); wait until that is over:
	// a key that is retried is never quiet for 50ms (RetryMaxDelay is 10ms).
	handled := h.seenCount(key)
	for deadline := time.Now().Add(5 * time.Second); ; handled = h.seenCount(key) {
		time.Sleep(50 * time.Millisecond)
		if h.seenCount(key) == handled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held key is still handled again and again after 5s: a held pod is retried")
		}
	}
	time.Sleep(200 * time.Millisecond) // many retry delays (RetryMaxDelay is 10ms)
	if calls := h.ops.history(); len(calls) != 3 {
		t.Fatalf("steps on held pods: %q", calls)
	}
	if n := h.seenCount(key); n != handled {
		t.Errorf("the held key was handled %d more times: a held pod is not retried", n-handled)
	}
	if _, ok := h.actual.Pod(diskKey); !ok {
		t.Fatal("the reconstructed publish of a held pod was dropped")
	}

	holds.set("p1", false)
	h.r.PodReleased([]volume.PodKey{key})
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1",
		"unpublish "+string(name)+"@p1")
	holds.set("disk", false)
	h.r.PodReleased([]volume.PodKey{diskKey})
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1",
		"unpublish "+string(name)+"@p1", "unpublish "+string(name)+"@disk", "unstage "+string(name))
}
