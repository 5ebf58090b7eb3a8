package operations

import (
	"context"
	"errors"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestLocksExclusiveAndShared(t *testing.T) {
	l := newLocks()
	ctx := t.Context()
	v := volume.Name("v")
	a, b := volume.PodKey{Volume: v, Pod: "a"}, volume.PodKey{Volume: v, Pod: "b"}

	// Two pods of one volume hold it at once.
	ua, err := l.lockPod(ctx, a, false)
	if err != nil {
		t.Fatal(err)
	}
	ub, err := l.lockPod(ctx, b, false)
	if err != nil {
		t.Fatal(err)
	}

	// An exclusive holder waits for them, and keeps new shared holders out.
	gotWriter := make(chan func())
	go func() {
		u, err := l.lockVolume(ctx, v, true)
		if err != nil {
			t.Error(err)
		}
		gotWriter <- u
	}()
	waitFor(t, "the exclusive waiter", func() bool { return l.waiters(v) == 1 })
	gotReader := make(chan func())
	go func() {
		u, err := l.lockPod(ctx, volume.PodKey{Volume: v, Pod: "c"}, false)
		if err != nil {
			t.Error(err)
		}
		gotReader <- u
	}()
	waitFor(t, "the shared waiter behind it", func() bool { return l.waiters(v) == 2 })

	ua()
	ub()
	uw := <-gotWriter
	select {
	case <-gotReader:
		t.Fatal("a shared holder got in while the exclusive one holds the volume")
	default:
	}
	uw()
	(<-gotReader)()

	l.mu.Lock()
	n := len(l.volumes)
	l.mu.Unlock()
	if n != 0 {
		t.Errorf("%d lock entries left after every holder released", n)
	}
}

func TestLocksSamePodWaitsAndContextEndsWait(t *testing.T) {
	l := newLocks()
	key := volume.PodKey{Volume: "v", Pod: "a"}
	unlock, err := l.lockPod(t.Context(), key, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() {
		_, err := l.lockPod(ctx, key, false)
		done <- err
	}()
	waitFor(t, "the second step on the same pod to wait", func() bool { return l.waiters("v") == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("lockPod after cancel = %v, want context.Canceled", err)
	}

	// A cancelled exclusive waiter lets the shared waiters behind it in.
	wctx, wcancel := context.WithCancel(t.Context())
	wdone := make(chan error)
	go func() {
		_, err := l.lockVolume(wctx, "v", true)
		wdone <- err
	}()
	waitFor(t, "the exclusive waiter", func() bool { return l.waiters("v") == 1 })
	rdone := make(chan func())
	go func() {
		u, err := l.lockPod(t.Context(), volume.PodKey{Volume: "v", Pod: "b"}, false)
		if err != nil {
			t.Error(err)
		}
		rdone <- u
	}()
	waitFor(t, "the shared waiter", func() bool { return l.waiters("v") == 2 })
	wcancel()
	if err := <-wdone; !errors.Is(err, context.Canceled) {
		t.Errorf("lockVolume after cancel = %v", err)
	}
	(<-rdone)()
	unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.volumes) != 0 {
		t.Errorf("lock entries left: %v", l.volumes)
	}
}
