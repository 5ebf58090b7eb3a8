package operations

import (
	"fmt"
	"maps"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestMapsDoNotGrowWithPods is issue 23's unbounded growth for the
// operations: pods each stage, publish and tear down a volume of their own
// through the lifecycle's steps; at the end the lock table, the request
// digests, the ownership changes and the actual state are back to their
// sizes at the start. Every step writes and fsyncs its durable record, so
// 200 pods stand for the 2,000 of the lifecycle's other growth tests: an
// entry left per pod shows after one.
func TestMapsDoNotGrowWithPods(t *testing.T) {
	h, _ := realDriverHarness(t)
	ctx := testContext(t)
	start := h.ops.mapSizes()
	for i := range 200 {
		src := pvSource()
		src.Handle = fmt.Sprintf("vol-%d", i)
		name := volume.PersistentName(src.Driver, src.Handle)
		uid := fmt.Sprintf("uid-%d", i)
		key := keyOf(src, uid)
		if err := h.ops.Stage(ctx, name, src, nil); err != nil {
			t.Fatal(err)
		}
		if err := h.ops.Publish(ctx, key, src, podVolume(uid, "pod-"+uid)); err != nil {
			t.Fatal(err)
		}
		if err := h.ops.Unpublish(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := h.ops.Unstage(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if end := h.ops.mapSizes(); !maps.Equal(start, end) {
		t.Errorf("after 200 pod lifecycles the operations' maps hold %v entries, %v at the start", end, start)
	}
	if names := h.world.VolumeNames(); len(names) != 0 {
		t.Errorf("the actual state still has %d volumes", len(names))
	}
}
