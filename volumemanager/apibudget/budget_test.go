package apibudget

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestOneBucket: the two lanes take their tokens from one bucket.
func TestOneBucket(t *testing.T) {
	b := New(0.001, 2)
	if !b.Reads().TryAccept() || !b.Reports().TryAccept() {
		t.Fatal("a bucket of 2 refused one of its first two tokens")
	}
	if b.Reads().TryAccept() || b.Reports().TryAccept() {
		t.Error("a bucket of 2 gave a third token: the lanes do not share it")
	}
}

// TestReadsGoFirst: a report that asks for a token while reads wait for
// theirs gets it after them, and after the reads that come while it
// waits: with one plain bucket it would have the token after the first
// reads and before the later ones.
func TestReadsGoFirst(t *testing.T) {
	b := New(50, 1)
	ctx := t.Context()
	if err := b.Reads().Wait(ctx); err != nil { // empties the bucket
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	take := func(who string, lane interface{ Wait(context.Context) error }) {
		wg.Go(func() {
			if err := lane.Wait(ctx); err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			order = append(order, who)
		})
	}
	waiting := func(reads, reports int) {
		waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return b.waiting == reads && b.yielding == reports })
	}
	const reads = 4 // 20 ms apart
	for range reads {
		take("read", b.Reads())
	}
	waiting(reads, 0)
	if b.Reports().TryAccept() {
		t.Error("a report took a token while reads waited")
	}
	take("report", b.Reports())
	waiting(reads, 1)
	for range reads {
		take("later read", b.Reads())
	}
	wg.Wait()
	if len(order) != 2*reads+1 || order[2*reads] != "report" {
		t.Errorf("tokens taken in the order %v, want every read before the report", order)
	}
}

// TestReportsWaitAtMostMaxDefer: under reads that never stop, a report
// still asks for its token after maxDefer.
func TestReportsWaitAtMostMaxDefer(t *testing.T) {
	b := New(1000, 1000)
	b.maxDefer = 50 * time.Millisecond
	b.enter() // a read that waits for as long as the test runs
	defer b.leave()
	start := time.Now()
	if err := b.Reports().Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < b.maxDefer || waited > 2*time.Second {
		t.Errorf("the report waited %v; want about %v", waited, b.maxDefer)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.Reports().Wait(ctx); err == nil {
		t.Error("a report's Wait with a cancelled context returned no error")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
