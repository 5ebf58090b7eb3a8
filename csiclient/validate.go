package csiclient

import (
	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ValidateRequest checks that a node or controller request carries the fields the CSI
// spec marks REQUIRED, so a malformed request is refused before it reaches
// the driver (which would answer InvalidArgument anyway). It returns nil or
// an InvalidArgument status error whose message starts with "csiclient:";
// the typed calls classify it as final. Requests of other types are not
// checked.
func ValidateRequest(req any) error {
	var missing string
	switch r := req.(type) {
	case *csi.NodeStageVolumeRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		case r.GetStagingTargetPath() == "":
			missing = "staging_target_path"
		case r.GetVolumeCapability() == nil:
			missing = "volume_capability"
		}
	case *csi.NodeUnstageVolumeRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		case r.GetStagingTargetPath() == "":
			missing = "staging_target_path"
		}
	case *csi.NodePublishVolumeRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		case r.GetTargetPath() == "":
			missing = "target_path"
		case r.GetVolumeCapability() == nil:
			missing = "volume_capability"
		}
	case *csi.NodeUnpublishVolumeRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		case r.GetTargetPath() == "":
			missing = "target_path"
		}
	case *csi.NodeGetVolumeStatsRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		case r.GetVolumePath() == "":
			missing = "volume_path"
		}
	case *csi.ControllerPublishVolumeRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		case r.GetNodeId() == "":
			missing = "node_id"
		case r.GetVolumeCapability() == nil:
			missing = "volume_capability"
		}
	case *csi.ControllerUnpublishVolumeRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		}
	case *csi.NodeExpandVolumeRequest:
		switch {
		case r == nil:
			missing = "request"
		case r.GetVolumeId() == "":
			missing = "volume_id"
		case r.GetVolumePath() == "":
			missing = "volume_path"
		}
	}
	if missing == "" {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "csiclient: %T: %s is required", req, missing)
}
