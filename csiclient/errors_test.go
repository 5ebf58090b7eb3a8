package csiclient

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassifyNonGRPCErrorIsUncertain(t *testing.T) {
	cause := errors.New("connection reset by peer")
	err := Classify("d.csi.test", methodNodeStageVolume, cause)

	if !errors.Is(err, ErrUncertain) || IsFinal(err) || IsAlreadyDone(err) {
		t.Fatalf("Classify(non-gRPC error) = %v, want only uncertain", err)
	}
	if !errors.Is(err, cause) {
		t.Errorf("errors.Is(err, cause) = false, want the cause reachable")
	}
	st, ok := status.FromError(err)
	if ok || st.Code() != codes.Unknown {
		t.Errorf("status.FromError = (%v, %v), want (Unknown, false) as for any non-gRPC error", st.Code(), ok)
	}
}

func TestClassifyKeepsDriverStatus(t *testing.T) {
	cause := status.Error(codes.FailedPrecondition, "volume in use")
	err := fmt.Errorf("staging volume v1: %w", Classify("d.csi.test", methodNodeExpandVolume, cause))

	if !IsFinal(err) {
		t.Fatalf("IsFinal(%v) = false, want true", err)
	}
	if got := status.Code(err); got != codes.FailedPrecondition {
		t.Errorf("status.Code = %v, want FailedPrecondition", got)
	}
	rpcErr, ok := errors.AsType[*RPCError](err)
	if !ok {
		t.Fatalf("errors.As(*RPCError) failed on %v", err)
	}
	if rpcErr.Method != methodNodeExpandVolume || rpcErr.Driver != "d.csi.test" || rpcErr.Code() != codes.FailedPrecondition {
		t.Errorf("RPCError = {Method: %q, Driver: %q, Code: %v}, want {NodeExpandVolume, d.csi.test, FailedPrecondition}",
			rpcErr.Method, rpcErr.Driver, rpcErr.Code())
	}
	// The unwrapped *RPCError relays the driver's status verbatim.
	st, ok := status.FromError(rpcErr)
	if !ok || st.Code() != codes.FailedPrecondition || st.Message() != "volume in use" {
		t.Errorf("status.FromError(*RPCError) = (%v, %q, %v), want (FailedPrecondition, %q, true)",
			st.Code(), st.Message(), ok, "volume in use")
	}
}

func TestClassifyIsIdempotent(t *testing.T) {
	first := Classify("d.csi.test", methodNodeUnstageVolume, status.Error(codes.NotFound, "gone"))
	wrapped := fmt.Errorf("unstage: %w", first)
	again := Classify("other", methodNodeStageVolume, wrapped)
	if rpcErr, ok := errors.AsType[*RPCError](again); !ok || rpcErr.Driver != "d.csi.test" || rpcErr.Method != methodNodeUnstageVolume {
		t.Errorf("Classify(classified error) = %v, want it unchanged", again)
	}
	if !IsAlreadyDone(wrapped) {
		t.Errorf("IsAlreadyDone(%v) = false, want true", wrapped)
	}
	if Classify("d", methodProbe, nil) != nil {
		t.Errorf("Classify(nil) != nil")
	}
}

func TestRPCErrorMessage(t *testing.T) {
	err := Classify("d.csi.test", methodNodePublishVolume, status.Error(codes.Internal, "mount failed"))
	want := `CSI NodePublishVolume on driver "d.csi.test" (final): rpc error: code = Internal desc = mount failed`
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}
