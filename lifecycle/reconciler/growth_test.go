package reconciler

import (
	"fmt"
	"maps"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestMapsDoNotGrowWithPods is issue 23's unbounded growth for the
// reconciler and the two states: 2,000 pods, 50 at a time, each get a
// volume of their own published and torn down again; at the end the
// reconciler's maps and queues, the desired and the actual state are back
// to their sizes at the start.
func TestMapsDoNotGrowWithPods(t *testing.T) {
	h := newHarness(t)
	close(h.synced)
	start := h.r.mapSizes()

	const pods, batch = 2000, 50
	for b := 0; b < pods; b += batch {
		var wg sync.WaitGroup
		for i := b; i < b+batch; i++ {
			wg.Go(func() {
				uid := types.UID(fmt.Sprintf("p%d", i))
				src := pvSource(fmt.Sprintf("v%d", i))
				h.setPod(uid, src)
			})
		}
		wg.Wait()
		eventually(t, fmt.Sprintf("pods %d-%d ready", b, b+batch-1), func() bool {
			for i := b; i < b+batch; i++ {
				if st, ok := h.status.get(types.UID(fmt.Sprintf("p%d", i))); !ok || !st.Ready {
					return false
				}
			}
			return true
		})
		for i := b; i < b+batch; i++ {
			h.desired.DeletePod(types.UID(fmt.Sprintf("p%d", i)))
		}
		eventually(t, fmt.Sprintf("pods %d-%d torn down", b, b+batch-1), func() bool {
			return len(h.actual.VolumeNames()) == 0
		})
	}

	eventually(t, "the reconciler's maps back to their start sizes", func() bool {
		return maps.Equal(start, h.r.mapSizes())
	})
	if n := len(h.desired.Volumes()); n != 0 {
		t.Errorf("the desired state still has %d volumes", n)
	}
	if n := len(h.desired.Pods()); n != 0 {
		t.Errorf("the desired state still has %d pods", n)
	}
}
