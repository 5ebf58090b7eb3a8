package status

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// rpcError mimics csiclient.RPCError: a wrapper whose text differs from the
// driver's status, and which exposes that status.
type rpcError struct{ st *grpcstatus.Status }

func (e *rpcError) Error() string                  { return "CSI call on driver (final): " + e.st.Err().Error() }
func (e *rpcError) GRPCStatus() *grpcstatus.Status { return e.st }

func TestBlockerReasonAndMessage(t *testing.T) {
	src := volume.Source{ID: volume.ID{Driver: "hostpath.csi.k8s.io", Handle: "vol-1", PVName: "pvc-1"}}
	stageErr := fmt.Errorf("staging at /var/lib/x: %w",
		&rpcError{st: grpcstatus.New(codes.Internal, "disk gone")})
	huge := strings.Repeat("h", 300)
	tests := map[string]struct {
		b           Blocker
		wantReason  string
		wantMessage string
	}{
		"waiting for attach": {
			b: Blocker{Step: volume.StepWaitForAttach, SpecName: "data", Source: src,
				Err: fmt.Errorf("waiting for VolumeAttachment csi-123 to be attached: %w", volume.ErrNotAttached)},
			wantReason: ReasonWaitingForAttach,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): " +
				"waiting for VolumeAttachment csi-123 to be attached: volume is not attached yet",
		},
		"ownership change in progress": {
			b: Blocker{Step: volume.StepApplyAccessControl, SpecName: "data", Source: src,
				Progress: "changing the group of the volume's files to fsGroup 2000: 125000 files in 31s"},
			wantReason: ReasonVolumesPending,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): " +
				"changing the group of the volume's files to fsGroup 2000: 125000 files in 31s",
		},
		"waiting for attach, no error": {
			b:           Blocker{Step: volume.StepWaitForAttach, SpecName: "data", Source: src},
			wantReason:  ReasonWaitingForAttach,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): waiting for the volume to be attached",
		},
		"attach error": {
			b: Blocker{Step: volume.StepWaitForAttach, SpecName: "data", Source: src,
				Err: errors.New("VolumeAttachment csi-123: attach error: quota exceeded")},
			wantReason:  ReasonAttachFailed,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): VolumeAttachment csi-123: attach error: quota exceeded",
		},
		"driver not registered at stage": {
			b: Blocker{Step: volume.StepStage, SpecName: "data", Source: src,
				Err: fmt.Errorf("driver hostpath.csi.k8s.io: %w", volume.ErrDriverNotRegistered)},
			wantReason:  ReasonDriverNotRegistered,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): driver hostpath.csi.k8s.io: CSI driver is not registered",
		},
		"stage failed with a driver status": {
			b:          Blocker{Step: volume.StepStage, SpecName: "data", Source: src, Err: stageErr},
			wantReason: ReasonNodeStageFailed,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): " +
				"NodeStageVolume failed: rpc error: code = Internal desc = disk gone",
		},
		"publish failed without a status": {
			b: Blocker{Step: volume.StepPublish, SpecName: "data", Source: src,
				Err: errors.New("creating target directory: permission denied")},
			wantReason: ReasonNodePublishFailed,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): " +
				"NodePublishVolume failed: creating target directory: permission denied",
		},
		"PVC not bound": {
			b: Blocker{SpecName: "data",
				Err: fmt.Errorf("PVC %q is not bound: %w", "data", volume.ErrInvalidSpec)},
			wantReason:  ReasonInvalidVolumeSpec,
			wantMessage: `volume data: PVC "data" is not bound: invalid volume specification`,
		},
		"invalid name": {
			b: Blocker{Step: volume.StepPublish, SpecName: "../x",
				Err: fmt.Errorf("volume name %q: %w", "../x", volume.ErrInvalidName)},
			wantReason:  ReasonInvalidVolumeSpec,
			wantMessage: `volume ../x: volume name "../x": invalid name`,
		},
		"in use by another pod": {
			b: Blocker{Step: volume.StepPublish, SpecName: "data", Source: src,
				Err: fmt.Errorf("ReadWriteOncePod volume is published for pod p2: %w", volume.ErrInUse)},
			wantReason:  ReasonVolumeInUse,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): ReadWriteOncePod volume is published for pod p2: volume is in use",
		},
		"stage in progress": {
			b:           Blocker{Step: volume.StepStage, SpecName: "data", Source: src},
			wantReason:  ReasonVolumesPending,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): NodeStageVolume in progress",
		},
		"unstage failed": {
			b:           Blocker{Step: volume.StepUnstage, SpecName: "data", Source: src, Err: errors.New("busy")},
			wantReason:  ReasonNodeUnstageFailed,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): NodeUnstageVolume failed: busy",
		},
		"expand failed": {
			b:           Blocker{Step: volume.StepExpand, SpecName: "data", Source: src, Err: errors.New("no space")},
			wantReason:  ReasonNodeExpandFailed,
			wantMessage: "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): NodeExpandVolume failed: no space",
		},
		"inline volume, huge handle": {
			b: Blocker{Step: volume.StepPublish, SpecName: "scratch",
				Source: volume.Source{ID: volume.ID{Driver: "d", Handle: huge}, Inline: true}, Err: errors.New("x")},
			wantReason: ReasonNodePublishFailed,
			wantMessage: "volume scratch (driver d, handle " + huge[:128-len(ellipsis)] + ellipsis +
				"): NodePublishVolume failed: x",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.b.Reason(); got != tc.wantReason {
				t.Errorf("Reason() = %q, want %q", got, tc.wantReason)
			}
			if got := tc.b.Message(); got != tc.wantMessage {
				t.Errorf("Message() =\n  %q\nwant\n  %q", got, tc.wantMessage)
			}
			s := Blocked(volume.PodInfo{Name: "p"}, tc.b)
			if s.Ready || s.Reason != tc.wantReason || s.Message != tc.wantMessage {
				t.Errorf("Blocked() = %+v, want not ready with the reason and message above", s)
			}
		})
	}
}

func TestSanitizeMessage(t *testing.T) {
	long := strings.Repeat("é", 2000) // 2 bytes each
	tests := map[string]struct {
		in, want string
	}{
		"plain":              {in: "NodeStageVolume failed", want: "NodeStageVolume failed"},
		"newlines and tabs":  {in: "a\n\tgoroutine 1:\r\n  main()\x00 end\n", want: "a goroutine 1: main() end"},
		"invalid utf-8":      {in: "bad \xff byte", want: "bad \uFFFD byte"},
		"exactly the limit":  {in: strings.Repeat("x", MaxMessageLength), want: strings.Repeat("x", MaxMessageLength)},
		"one over the limit": {in: strings.Repeat("x", MaxMessageLength+1), want: strings.Repeat("x", MaxMessageLength-3) + ellipsis},
		"multi-byte cut":     {in: long, want: strings.Repeat("é", (MaxMessageLength-3)/2) + ellipsis},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := sanitizeMessage(tc.in)
			if got != tc.want {
				t.Errorf("sanitizeMessage() = %q (%d bytes), want %q (%d bytes)", got, len(got), tc.want, len(tc.want))
			}
			if len(got) > MaxMessageLength || !utf8.ValidString(got) {
				t.Errorf("sanitizeMessage() = %d bytes, valid UTF-8 %v; want ≤ %d bytes of valid UTF-8",
					len(got), utf8.ValidString(got), MaxMessageLength)
			}
		})
	}
}
