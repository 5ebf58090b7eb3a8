package front

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// recordingSteps is an Operations that records the requests that get past
// the front's checks and does nothing.
type recordingSteps struct {
	reached []proto.Message
	pods    []types.UID
}

func (r *recordingSteps) StageRequest(_ context.Context, _ string, req *csi.NodeStageVolumeRequest) error {
	r.reached = append(r.reached, req)
	return nil
}

func (r *recordingSteps) UnstageRequest(_ context.Context, _ string, req *csi.NodeUnstageVolumeRequest) error {
	r.reached = append(r.reached, req)
	return nil
}

func (r *recordingSteps) PublishRequest(_ context.Context, _ string, pod types.UID, req *csi.NodePublishVolumeRequest) error {
	r.reached, r.pods = append(r.reached, req), append(r.pods, pod)
	return nil
}

func (r *recordingSteps) UnpublishRequest(_ context.Context, _ string, pod types.UID, req *csi.NodeUnpublishVolumeRequest) error {
	r.reached, r.pods = append(r.reached, req), append(r.pods, pod)
	return nil
}

func (r *recordingSteps) VolumeStats(_ context.Context, _ string, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	r.reached = append(r.reached, req)
	return &csi.NodeGetVolumeStatsResponse{}, nil
}

func (r *recordingSteps) ExpandVolume(_ context.Context, _ string, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	r.reached = append(r.reached, req)
	return &csi.NodeExpandVolumeResponse{}, nil
}

func (r *recordingSteps) VolumeHealth(_ context.Context, _ string, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	r.reached = append(r.reached, req)
	return &csi.NodeGetVolumeHealthResponse{}, nil
}

func (r *recordingSteps) NodeCapabilities(context.Context, string) (csiclient.NodeCapabilities, error) {
	return csiclient.NodeCapabilities{}, nil
}

func (r *recordingSteps) NodeInfo(context.Context, string) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{}, nil
}

// safePath is what the front promises of a path it hands to the lifecycle
// to mount at: absolute, clean, without NUL.
func safePath(p string) bool {
	return filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}

func validCapability(c *csi.VolumeCapability) bool {
	return c != nil && c.GetAccessMode() != nil && (c.GetMount() != nil || c.GetBlock() != nil)
}

// FuzzNodeRequestValidation sends the front endpoint's Node handlers
// requests decoded from arbitrary wire bytes, as a container orchestrator
// (or anything that can reach the socket) may send them: a request either
// reaches the lifecycle with a volume ID, paths that are absolute, clean
// and free of NUL, and a usable capability, or is answered InvalidArgument
// without reaching it; nothing panics.
func FuzzNodeRequestValidation(f *testing.F) {
	mount := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4", MountFlags: []string{"ro"}}},
	}
	seeds := []proto.Message{
		&csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: mount, Secrets: map[string]string{"k": "v"}},
		&csi.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s/../.."},
		&csi.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", StagingTargetPath: "/s", VolumeCapability: mount, Readonly: true},
		&csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "relative/t"},
		&csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: "/t\x00"},
		&csi.NodeExpandVolumeRequest{VolumeId: "v", VolumePath: "/t", StagingTargetPath: "/s/"},
	}
	for i, m := range seeds {
		data, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), data)
	}
	f.Fuzz(func(t *testing.T, method uint8, data []byte) {
		steps := &recordingSteps{}
		n := &nodeServer{s: &Server{cfg: Config{Driver: "d.example.com", Operations: steps}}}
		ctx := t.Context()
		var err error
		var check func() string
		switch method % 6 {
		case 0:
			req := &csi.NodeStageVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = n.NodeStageVolume(ctx, req)
			check = func() string {
				if req.GetVolumeId() == "" || !safePath(req.GetStagingTargetPath()) || !validCapability(req.GetVolumeCapability()) {
					return "NodeStageVolume"
				}
				return ""
			}
		case 1:
			req := &csi.NodeUnstageVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = n.NodeUnstageVolume(ctx, req)
			check = func() string {
				if req.GetVolumeId() == "" || !safePath(req.GetStagingTargetPath()) {
					return "NodeUnstageVolume"
				}
				return ""
			}
		case 2:
			req := &csi.NodePublishVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = n.NodePublishVolume(ctx, req)
			check = func() string {
				if req.GetVolumeId() == "" || !safePath(req.GetTargetPath()) || !validCapability(req.GetVolumeCapability()) ||
					(req.GetStagingTargetPath() != "" && !safePath(req.GetStagingTargetPath())) || steps.pods[0] != PodUID(req.GetTargetPath()) {
					return "NodePublishVolume"
				}
				return ""
			}
		case 3:
			req := &csi.NodeUnpublishVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = n.NodeUnpublishVolume(ctx, req)
			check = func() string {
				if req.GetVolumeId() == "" || !safePath(req.GetTargetPath()) || steps.pods[0] != PodUID(req.GetTargetPath()) {
					return "NodeUnpublishVolume"
				}
				return ""
			}
		case 4:
			req := &csi.NodeGetVolumeStatsRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = n.NodeGetVolumeStats(ctx, req)
			check = func() string {
				if req.GetVolumeId() == "" || req.GetVolumePath() == "" || strings.ContainsRune(req.GetVolumePath(), 0) ||
					(req.GetStagingTargetPath() != "" && !safePath(req.GetStagingTargetPath())) {
					return "NodeGetVolumeStats"
				}
				return ""
			}
		case 5:
			req := &csi.NodeExpandVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = n.NodeExpandVolume(ctx, req)
			check = func() string {
				if req.GetVolumeId() == "" || req.GetVolumePath() == "" || strings.ContainsRune(req.GetVolumePath(), 0) ||
					(req.GetStagingTargetPath() != "" && !safePath(req.GetStagingTargetPath())) {
					return "NodeExpandVolume"
				}
				return ""
			}
		}
		if len(steps.reached) == 0 {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a request that did not reach the lifecycle was answered %v, want InvalidArgument", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("a request that reached the lifecycle failed: %v", err)
		}
		if what := check(); what != "" {
			t.Fatalf("%s reached the lifecycle with %v", what, steps.reached[0])
		}
	})
}
