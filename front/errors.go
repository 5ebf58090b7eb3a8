package front

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// errorCodes is the one table that turns lifecycle errors into the gRPC
// codes the front endpoint answers with, as etcd's togRPCError does. The
// first entry the error matches (errors.Is) wins.
var errorCodes = []struct {
	err  error
	code codes.Code
}{
	// The backend is not registered (yet, or since it went): retry later.
	{volume.ErrDriverNotRegistered, codes.Unavailable},
	// Nothing is staged or published at the path the caller named.
	{volume.ErrNotFound, codes.NotFound},
	// A name or path that cannot be made safe, or a request the lifecycle
	// cannot serve as given.
	{volume.ErrInvalidName, codes.InvalidArgument},
	{volume.ErrInvalidSpec, codes.InvalidArgument},
	// Another use of the volume must end first (published elsewhere, staged
	// by someone else or at another path, still mounted from the staging
	// path).
	{volume.ErrInUse, codes.FailedPrecondition},
	{volume.ErrNotStaged, codes.FailedPrecondition},
	{volume.ErrNotAttached, codes.FailedPrecondition},
	// The driver said it was done but left the path mounted.
	{operations.ErrStillMounted, codes.Internal},
	// The caller gave up, while waiting for another step on the volume.
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	// The call may not have reached the driver (connection lost, socket
	// gone): the caller should retry.
	{csiclient.ErrUncertain, codes.Unavailable},
}

// toGRPCError returns err as a gRPC status error. An error that already
// carries a gRPC status keeps it — in particular a driver's answer,
// relayed with its code and message unchanged (csiclient.RPCError) — and
// every other error gets the code of its first match in errorCodes, or
// Internal. The message is err's text.
func toGRPCError(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			return status.Error(e.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}
