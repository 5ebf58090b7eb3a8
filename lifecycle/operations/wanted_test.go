package operations

import (
	"errors"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// fakeWanted is a desired state: every volume and use is wanted until it
// is dropped.
type fakeWanted struct {
	mu      sync.Mutex
	volumes map[volume.Name]bool
	uses    map[volume.PodKey]bool
}

func newFakeWanted() *fakeWanted {
	return &fakeWanted{volumes: map[volume.Name]bool{}, uses: map[volume.PodKey]bool{}}
}

func (f *fakeWanted) VolumeWanted(name volume.Name) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.volumes[name]
}

func (f *fakeWanted) UseWanted(key volume.PodKey) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.uses[key]
}

// drop makes the pod's use, and the volume, unwanted: the pod was deleted.
func (f *fakeWanted) drop(key volume.PodKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uses[key] = true
	f.volumes[key.Volume] = true
}

// waitForWaiter waits until a step is blocked on the volume's lock.
func waitForWaiter(t *testing.T, h *harness, name volume.Name, what string) {
	t.Helper()
	deadline := time.Now().Add(awaitTimeout)
	for h.ops.locks.waiters(name) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not wait for the volume's lock within %v", what, awaitTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// stepBehindTeardown runs teardown, held inside the driver at method, and
// step while teardown holds the volume's lock; it releases teardown once
// step waits for the lock and returns step's error.
func stepBehindTeardown(t *testing.T, h *harness, d *csiclienttest.Driver, name volume.Name, method string, teardown, step func() error) error {
	t.Helper()
	g := block(d, method)
	tornDown := goErr(teardown)
	g.await(t, "the reconciler's teardown")
	stepped := goErr(step)
	waitForWaiter(t, h, name, "the step decided before the teardown")
	close(g.release)
	if err := <-tornDown; err != nil {
		t.Fatalf("teardown: %v", err)
	}
	return <-stepped
}

// TestStageDecidedBeforeATeardownIsNotRun is issue 23's stale snapshot of
// the mount check: the check saw the volume staged and wanted and decided
// to stage it again; meanwhile the pod was deleted and the reconciler's
// unstage held the volume's lock. Once the unstage is done, the waiting
// stage must not bring the volume back: no NodeStageVolume, no actual-state
// entry (which would keep it in volumesInUse).
func TestStageDecidedBeforeATeardownIsNotRun(t *testing.T) {
	h, d := realDriverHarness(t)
	wanted := newFakeWanted()
	h.ops.wanted = wanted
	ctx := testContext(t)
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}

	wanted.drop(key)
	err := stepBehindTeardown(t, h, d, name, csi.Node_NodeUnstageVolume_FullMethodName,
		func() error { return h.ops.Unstage(ctx, name) },
		func() error { return h.ops.Stage(ctx, name, src, nil) })
	if !errors.Is(err, volume.ErrNotWanted) {
		t.Errorf("Stage after the volume was forgotten = %v, want an error wrapping volume.ErrNotWanted", err)
	}
	if n := d.CallCount(csi.Node_NodeStageVolume_FullMethodName); n != 1 {
		t.Errorf("NodeStageVolume called %d times, want once: the volume was staged again after its unstage", n)
	}
	if v, ok := h.world.Volume(name); ok {
		t.Errorf("the actual state knows the forgotten volume again: %+v", v)
	}
}

// TestPublishDecidedBeforeAPodLeftIsNotRun is issue 23's stale snapshot of
// the republisher: a republish was due when the pod was deleted, and it
// waited for the pod's lock behind the reconciler's unpublish. Once the
// unpublish is done, the waiting publish must not call NodePublishVolume
// for the dead pod (a secrets or certificate driver would fetch for it).
func TestPublishDecidedBeforeAPodLeftIsNotRun(t *testing.T) {
	h, d := realDriverHarness(t)
	wanted := newFakeWanted()
	h.ops.wanted = wanted
	ctx := testContext(t)
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	key := keyOf(src, "uid-a")
	pv := podVolume("uid-a", "pod-a")
	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Publish(ctx, key, src, pv); err != nil {
		t.Fatal(err)
	}

	wanted.drop(key)
	err := stepBehindTeardown(t, h, d, name, csi.Node_NodeUnpublishVolume_FullMethodName,
		func() error { return h.ops.Unpublish(ctx, key) },
		func() error { return h.ops.Publish(ctx, key, src, pv) })
	if !errors.Is(err, volume.ErrNotWanted) {
		t.Errorf("Publish after the pod left = %v, want an error wrapping volume.ErrNotWanted", err)
	}
	if n := d.CallCount(csi.Node_NodePublishVolume_FullMethodName); n != 1 {
		t.Errorf("NodePublishVolume called %d times, want once: the dead pod's volume was published again", n)
	}
	if p, ok := h.world.Pod(key); ok {
		t.Errorf("the actual state knows the dead pod's publish again: %+v", p)
	}
}
