package front

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestToGRPCError(t *testing.T) {
	backend := status.Error(codes.ResourceExhausted, "backend says: too many volumes")
	for name, tc := range map[string]struct {
		err  error
		code codes.Code
		// message is the expected message when it is not err's text.
		message string
	}{
		"nil":                     {err: nil, code: codes.OK},
		"driver not registered":   {err: fmt.Errorf("%w: %q", volume.ErrDriverNotRegistered, "d"), code: codes.Unavailable},
		"not found":               {err: fmt.Errorf("%w: v", volume.ErrNotFound), code: codes.NotFound},
		"invalid name":            {err: fmt.Errorf("%w: bad", volume.ErrInvalidName), code: codes.InvalidArgument},
		"invalid spec":            {err: fmt.Errorf("%w: bad", volume.ErrInvalidSpec), code: codes.InvalidArgument},
		"in use":                  {err: fmt.Errorf("%w: published for pods a", volume.ErrInUse), code: codes.FailedPrecondition},
		"not staged":              {err: volume.ErrNotStaged, code: codes.FailedPrecondition},
		"not attached":            {err: volume.ErrNotAttached, code: codes.FailedPrecondition},
		"still mounted":           {err: fmt.Errorf("/t is %w", operations.ErrStillMounted), code: codes.Internal},
		"lock wait cancelled":     {err: fmt.Errorf("waiting for other steps on volume v: %w", context.Canceled), code: codes.Canceled},
		"lock wait timed out":     {err: fmt.Errorf("waiting: %w", context.DeadlineExceeded), code: codes.DeadlineExceeded},
		"unknown error":           {err: errors.New("disk on fire"), code: codes.Internal, message: "disk on fire"},
		"backend status verbatim": {err: csiclient.Classify("d", "NodeStageVolume", backend), code: codes.ResourceExhausted, message: "backend says: too many volumes"},
		"pass-through status":     {err: backend, code: codes.ResourceExhausted, message: "backend says: too many volumes"},
		"uncertain, not gRPC":     {err: csiclient.Classify("d", "NodeStageVolume", errors.New("connection reset")), code: codes.Unavailable},
		"wrapped backend status": {
			err:  fmt.Errorf("getting the node capabilities: %w", csiclient.Classify("d", "NodeGetCapabilities", status.Error(codes.Unavailable, "gone"))),
			code: codes.Unavailable,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := toGRPCError(tc.err)
			st, ok := status.FromError(got)
			if !ok {
				t.Fatalf("toGRPCError(%v) = %v, not a status error", tc.err, got)
			}
			if st.Code() != tc.code {
				t.Errorf("code = %v, want %v (error %v)", st.Code(), tc.code, tc.err)
			}
			if tc.err == nil {
				return
			}
			want := tc.err.Error()
			if tc.message != "" {
				// A driver's status keeps its own message.
				want = tc.message
			}
			if st.Message() != want {
				t.Errorf("message = %q, want %q", st.Message(), want)
			}
		})
	}
}
