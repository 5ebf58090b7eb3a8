package reconciler

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestUnreadableVolumeOfALivePodIsKept: a pod still in the desired state
// whose volume could not be read (after a restart its use is not desired
// yet, but its publish is on disk) keeps that publish; once the pod leaves,
// the volume is torn down.
func TestUnreadableVolumeOfALivePodIsKept(t *testing.T) {
	h := newHarness(t)
	src := pvSource("u1")
	name := volume.PersistentName(testDriver, "u1")
	h.setPod("p1", src)
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1")
	close(h.synced)

	// The pod is resolved again, its claim now unreadable (Forbidden, or
	// the API server failing past the grace).
	h.desired.SetPod(dsw.Pod{
		Info: volume.PodInfo{UID: "p1", Namespace: "ns", Name: "pod-p1"}, FirstSeen: time.Now(),
		Errors: []dsw.VolumeError{{SpecName: "vol-0", Err: fmt.Errorf("%w: persistentvolumeclaims \"data\" is forbidden", volume.ErrUnreadable)}},
	})
	h.r.resync()
	key := volume.PodKey{Volume: name, Pod: "p1"}
	eventually(t, "the unwanted key handled", func() bool { return h.seenCount(key) >= 2 })
	// Kept, and looked at again (unreadableRecheck): still kept.
	seen := h.seenCount(key)
	eventually(t, "the kept key looked at again", func() bool { return h.seenCount(key) > seen })
	if calls := h.ops.history(); slices.Contains(calls, "unpublish "+key.String()) {
		t.Fatalf("calls %q: the publish of a live pod with an unreadable volume was torn down", calls)
	}

	h.desired.DeletePod("p1")
	eventually(t, "teardown once the pod left", func() bool {
		return slices.Contains(h.ops.history(), "unpublish "+key.String()) && slices.Contains(h.ops.history(), "unstage "+string(name))
	})
}
