// Package apibudget is an agent's API budget with two lanes: one token
// bucket (QPS and burst, as client-go's) shared by the client that reads
// what the volumes wait for and the client that reports (pod conditions,
// Events), where a report takes its token only while no read waits for
// one, or once it has waited MaxReportDefer.
//
// The kubelet's pod status manager writes through its one KubeClient, so a
// burst of pods at a small budget queues its status writes among the reads
// that its volumes wait for. With lanes the budget stays one — the sum of
// requests per second is bounded by the same bucket — while the volumes
// are published as soon as their reads allow, and the conditions follow.
package apibudget

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"
)

// MaxReportDefer bounds how long a report yields to reads: under a
// sustained stream of reads, reports still get a token every so often.
const MaxReportDefer = 5 * time.Second

// Budget is one token bucket with a reads lane and a reports lane; give
// each lane to the rest.Config.RateLimiter of its client.
type Budget struct {
	bucket flowcontrol.RateLimiter
	// maxDefer is MaxReportDefer; tests shorten it.
	maxDefer time.Duration

	// mu guards waiting, yielding and clear.
	mu sync.Mutex
	// waiting counts the reads waiting for a token; yielding the reports
	// waiting for them.
	waiting, yielding int
	// clear is closed when waiting drops to 0; nil while it is 0.
	clear chan struct{}
}

// New returns a budget of qps requests per second and bursts of burst,
// as client-go's flowcontrol.NewTokenBucketRateLimiter.
func New(qps float32, burst int) *Budget {
	return &Budget{bucket: flowcontrol.NewTokenBucketRateLimiter(qps, burst), maxDefer: MaxReportDefer}
}

// Reads is the lane of the requests the volumes wait for.
func (b *Budget) Reads() flowcontrol.RateLimiter { return readLane{b} }

// Reports is the lane of the requests that only report.
func (b *Budget) Reports() flowcontrol.RateLimiter { return reportLane{b} }

func (b *Budget) enter() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiting == 0 {
		b.clear = make(chan struct{})
	}
	b.waiting++
}

func (b *Budget) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waiting--
	if b.waiting == 0 {
		close(b.clear)
		b.clear = nil
	}
}

// readsWaiting returns a channel closed once no read waits, nil if none
// waits now.
func (b *Budget) readsWaiting() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clear
}

// yield waits until no read waits for a token, at most deadline's
// remaining time.
func (b *Budget) yield(ctx context.Context, deadline <-chan time.Time) error {
	b.mu.Lock()
	b.yielding++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.yielding--
		b.mu.Unlock()
	}()
	for {
		cleared := b.readsWaiting()
		if cleared == nil {
			return nil
		}
		select {
		case <-cleared:
		case <-deadline:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type readLane struct{ b *Budget }

func (l readLane) TryAccept() bool { return l.b.bucket.TryAccept() }

func (l readLane) Accept() {
	l.b.enter()
	defer l.b.leave()
	l.b.bucket.Accept()
}

func (l readLane) Wait(ctx context.Context) error {
	l.b.enter()
	defer l.b.leave()
	return l.b.bucket.Wait(ctx)
}

func (l readLane) Stop()        {}
func (l readLane) QPS() float32 { return l.b.bucket.QPS() }

type reportLane struct{ b *Budget }

// TryAccept takes a token only while no read waits.
func (l reportLane) TryAccept() bool {
	return l.b.readsWaiting() == nil && l.b.bucket.TryAccept()
}

func (l reportLane) Accept() {
	_ = l.Wait(context.Background())
}

func (l reportLane) Wait(ctx context.Context) error {
	deadline := time.NewTimer(l.b.maxDefer)
	defer deadline.Stop()
	if err := l.b.yield(ctx, deadline.C); err != nil {
		return err
	}
	return l.b.bucket.Wait(ctx)
}

func (l reportLane) Stop()        {}
func (l reportLane) QPS() float32 { return l.b.bucket.QPS() }
