package check

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestPublishRetryingAborted: Aborted, which the CSI spec allows while
// another call of the volume is in flight, is retried as the kubelet
// retries it, and the publish passes once it succeeds; any other error
// ends it at once.
func TestPublishRetryingAborted(t *testing.T) {
	aborted := status.Error(codes.Aborted, "an operation is pending for the volume")
	for _, tc := range []struct {
		name    string
		answers []error
		calls   int
		want    codes.Code
	}{
		{"ok", []error{nil}, 1, codes.OK},
		{"aborted twice, then ok", []error{aborted, aborted, nil}, 3, codes.OK},
		{"internal is not retried", []error{status.Error(codes.Internal, "boom")}, 1, codes.Internal},
		{"wrapped aborted, then ok", []error{errors.Join(errors.New("publish"), aborted), nil}, 2, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved := abortedBackoff
			abortedBackoff = []time.Duration{1, 1, 1, 1}
			defer func() { abortedBackoff = saved }()
			n := 0
			err := publishRetryingAborted(t.Context(), func() error {
				n++
				return tc.answers[min(n, len(tc.answers))-1]
			})
			if status.Code(err) != tc.want || n != tc.calls {
				t.Errorf("error %v after %d calls, want code %v after %d", err, n, tc.want, tc.calls)
			}
		})
	}
}
