package check

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
)

// interference is what the recorder does to the next call of a method.
type interference int

const (
	// withhold answers DeadlineExceeded after the hold timeout, while the
	// driver's call goes on in the background: a call held past the
	// caller's deadline.
	withhold interference = iota + 1
	// loseAnswer waits for the driver's answer and then answers
	// DeadlineExceeded: the answer was lost.
	loseAnswer
)

// recorder is the operations' DriverClient: every call goes to the driver
// and is recorded, with its duration, in the current scenario's calls.
type recorder struct {
	c    *csiclient.Client
	hold time.Duration
	// onCall, when set, is told of every node call before it is sent.
	onCall func(method string)

	mu    sync.Mutex
	calls []Call
	next  map[string]interference
	// background counts withheld calls still running.
	background sync.WaitGroup
}

var _ operations.DriverClient = &recorder{}

func newRecorder(c *csiclient.Client, hold time.Duration) *recorder {
	return &recorder{c: c, hold: hold, next: map[string]interference{}}
}

// take returns and clears the calls recorded so far.
func (r *recorder) take() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

// interfere makes the recorder do i to the next call of method.
func (r *recorder) interfere(method string, i interference) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next[method] = i
}

func (r *recorder) add(c Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

// record records a call that ended with err after d.
func (r *recorder) record(method string, d time.Duration, err error, note string) {
	st := status.Convert(unwrapRPC(err))
	c := Call{Method: method, Code: st.Code().String(), Duration: d, Note: note}
	if err != nil {
		c.Message = st.Message()
	}
	r.add(c)
}

func unwrapRPC(err error) error {
	if err == nil {
		return nil
	}
	var rpc *csiclient.RPCError
	if errors.As(err, &rpc) {
		return rpc.Err
	}
	return err
}

// do runs one call, interfering as asked.
func (r *recorder) do(ctx context.Context, method string, call func(ctx context.Context) error) error {
	if r.onCall != nil {
		r.onCall(method)
	}
	r.mu.Lock()
	i := r.next[method]
	delete(r.next, method)
	r.mu.Unlock()
	start := time.Now()
	switch i {
	case withhold:
		done := make(chan struct{})
		r.background.Add(1)
		go func() {
			defer r.background.Done()
			defer close(done)
			err := call(context.WithoutCancel(ctx))
			r.record(method, time.Since(start), err, fmt.Sprintf("the first call, whose answer the check withheld past %s", r.hold))
		}()
		t := time.NewTimer(r.hold)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return r.deadline(method)
	case loseAnswer:
		err := call(ctx)
		r.record(method, time.Since(start), err, "its answer lost by the check: the caller saw DeadlineExceeded")
		return r.deadline(method)
	}
	err := call(ctx)
	r.record(method, time.Since(start), err, "")
	return err
}

// deadline is the error of a call whose deadline passed.
func (r *recorder) deadline(method string) error {
	return csiclient.Classify(r.c.DriverName(), method,
		status.Error(codes.DeadlineExceeded, "csi-volmgr check: the answer did not come before the deadline"))
}

func (r *recorder) NodeCapabilities(ctx context.Context) (csiclient.NodeCapabilities, error) {
	return r.c.NodeCapabilities(ctx)
}

func (r *recorder) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) error {
	return r.do(ctx, "NodeStageVolume", func(ctx context.Context) error { return r.c.NodeStageVolume(ctx, req) })
}

func (r *recorder) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) error {
	return r.do(ctx, "NodeUnstageVolume", func(ctx context.Context) error { return r.c.NodeUnstageVolume(ctx, req) })
}

func (r *recorder) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) error {
	return r.do(ctx, "NodePublishVolume", func(ctx context.Context) error { return r.c.NodePublishVolume(ctx, req) })
}

func (r *recorder) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) error {
	return r.do(ctx, "NodeUnpublishVolume", func(ctx context.Context) error { return r.c.NodeUnpublishVolume(ctx, req) })
}

func (r *recorder) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	var resp *csi.NodeGetVolumeStatsResponse
	err := r.do(ctx, "NodeGetVolumeStats", func(ctx context.Context) (err error) {
		resp, err = r.c.NodeGetVolumeStats(ctx, req)
		return err
	})
	return resp, err
}

func (r *recorder) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	var resp *csi.NodeExpandVolumeResponse
	err := r.do(ctx, "NodeExpandVolume", func(ctx context.Context) (err error) {
		resp, err = r.c.NodeExpandVolume(ctx, req)
		return err
	})
	return resp, err
}

func (r *recorder) NodeGetInfo(ctx context.Context) (*csi.NodeGetInfoResponse, error) {
	return r.c.NodeGetInfo(ctx)
}

// controller records a controller call made by the check itself.
func (r *recorder) controller(method string, start time.Time, err error) {
	r.record(method, time.Since(start), err, "")
}
