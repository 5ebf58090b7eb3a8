package operations

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestTransitions is the table of transitions.go, for both set-up steps.
func TestTransitions(t *testing.T) {
	final := csiclient.Classify("d", "NodeStageVolume", status.Error(codes.Internal, "x"))
	uncertain := csiclient.Classify("d", "NodeStageVolume", status.Error(codes.DeadlineExceeded, "x"))
	unclassified := errors.New("not from csiclient")
	type state int // 0 not, 1 uncertain, 2 done
	for _, tc := range []struct {
		prev          state
		reconstructed bool
		err           error
		want          state
	}{
		{0, false, nil, 2}, {1, false, nil, 2}, {2, false, nil, 2}, {1, true, nil, 2},
		{0, false, uncertain, 1}, {1, false, uncertain, 1}, {2, false, uncertain, 2}, {1, true, uncertain, 1},
		{0, false, unclassified, 1}, {2, false, unclassified, 2},
		{0, false, final, 0}, {1, false, final, 0}, {2, false, final, 2}, {1, true, final, 1},
	} {
		stage := afterStage([]volume.StageState{volume.NotStaged, volume.StageUncertain, volume.Staged}[tc.prev], tc.reconstructed, tc.err)
		if want := []volume.StageState{volume.NotStaged, volume.StageUncertain, volume.Staged}[tc.want]; stage != want {
			t.Errorf("afterStage(%d, reconstructed %v, %v) = %v, want %v", tc.prev, tc.reconstructed, tc.err, stage, want)
		}
		pub := afterPublish([]volume.PublishState{volume.NotPublished, volume.PublishUncertain, volume.Published}[tc.prev], tc.reconstructed, tc.err)
		if want := []volume.PublishState{volume.NotPublished, volume.PublishUncertain, volume.Published}[tc.want]; pub != want {
			t.Errorf("afterPublish(%d, reconstructed %v, %v) = %v, want %v", tc.prev, tc.reconstructed, tc.err, pub, want)
		}
	}
}
