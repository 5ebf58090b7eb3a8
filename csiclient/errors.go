package csiclient

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error classes. Every error returned by a typed Client call is an *RPCError
// whose class matches exactly one of these sentinels with errors.Is.
var (
	// ErrFinal means the driver answered and the step did not happen: the
	// call failed for good and nothing is in progress on the driver's side.
	// Retrying the same request is pointless until the desired state changes.
	ErrFinal = errors.New("final")

	// ErrUncertain means the outcome is unknown: the step may have happened,
	// may still be in progress, or may not have started. Callers record the
	// step as uncertain and retry while it is wanted, tear it down when not.
	ErrUncertain = errors.New("uncertain")

	// ErrAlreadyDone means a teardown call (NodeUnpublishVolume,
	// NodeUnstageVolume, ControllerUnpublishVolume) was answered with NotFound: the volume is already
	// gone from the target, so the step can be treated as successful.
	ErrAlreadyDone = errors.New("already done")
)

// RPCError is a failed CSI call, classified.
//
// errors.Is(err, ErrFinal|ErrUncertain|ErrAlreadyDone) reports its class;
// Unwrap returns the original error, so status.FromError and status.Code on
// an *RPCError (or on any error wrapping one) still give the driver's gRPC
// code. GRPCStatus returns the driver's status unchanged, so relaying an
// *RPCError over gRPC reproduces the driver's code and message.
type RPCError struct {
	// Driver is the CSI driver name the call went to.
	Driver string
	// Method is the short CSI method name, e.g. "NodeStageVolume".
	Method string
	// Class is ErrFinal, ErrUncertain or ErrAlreadyDone.
	Class error
	// Err is the error returned by gRPC (a status error when the driver
	// answered) or by request validation.
	Err error
}

// Error implements error.
func (e *RPCError) Error() string {
	return fmt.Sprintf("CSI %s on driver %q (%v): %v", e.Method, e.Driver, e.Class, e.Err)
}

// Unwrap returns the underlying gRPC (or validation) error.
func (e *RPCError) Unwrap() error { return e.Err }

// Is reports whether target is this error's class sentinel.
func (e *RPCError) Is(target error) bool { return target != nil && target == e.Class }

// GRPCStatus returns the status carried by the underlying error, with the
// driver's code and message unchanged. It returns nil when the underlying
// error carries no gRPC status, in which case status.FromError treats the
// *RPCError like any other non-gRPC error (codes.Unknown, ok == false).
func (e *RPCError) GRPCStatus() *status.Status {
	if st, ok := status.FromError(e.Err); ok {
		return st
	}
	return nil
}

// Code returns the gRPC code of the underlying error; codes.Unknown when it
// is not a gRPC error.
func (e *RPCError) Code() codes.Code { return status.Code(e.Err) }

// IsFinal reports whether err is a final CSI error (see ErrFinal).
func IsFinal(err error) bool { return errors.Is(err, ErrFinal) }

// IsAlreadyDone reports whether err means a teardown step already happened
// (see ErrAlreadyDone).
func IsAlreadyDone(err error) bool { return errors.Is(err, ErrAlreadyDone) }

// Classify wraps err, returned by CSI method (short name, e.g.
// "NodeUnstageVolume") of driver, in an *RPCError with its class. It returns
// nil for nil and err itself when err already contains an *RPCError.
//
// The rule follows kubernetes pkg/volume/csi/csi_client.go isFinalError:
//
//   - not a gRPC status error (the call may never have reached the driver,
//     or the connection broke): uncertain;
//   - Canceled, DeadlineExceeded, Unavailable, ResourceExhausted, Aborted:
//     uncertain, the step may still be in progress;
//   - NotFound from NodeUnpublishVolume, NodeUnstageVolume or
//     ControllerUnpublishVolume: already done (for the last, as the
//     external-attacher treats it: the volume or the node is gone);
//   - every other code (InvalidArgument, NotFound, AlreadyExists,
//     FailedPrecondition, OutOfRange, PermissionDenied, Unauthenticated,
//     Unimplemented, Internal, DataLoss, Unknown): final.
func Classify(driver, method string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*RPCError](err); ok {
		return err
	}
	return &RPCError{Driver: driver, Method: method, Class: classOf(method, err), Err: err}
}

// classOf returns the class sentinel for err returned by method.
func classOf(method string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return ErrUncertain
	}
	switch st.Code() {
	case codes.Canceled, // the caller's context ended: the driver may still be working
		codes.DeadlineExceeded,  // timeout: the driver may still be working
		codes.Unavailable,       // driver restarting, connection broken
		codes.ResourceExhausted, // driver temporarily out of resources
		codes.Aborted:           // CSI: an operation is already pending for this volume
		return ErrUncertain
	case codes.NotFound:
		if method == methodNodeUnpublishVolume || method == methodNodeUnstageVolume || method == methodControllerUnpublishVolume {
			return ErrAlreadyDone
		}
	}
	return ErrFinal
}
