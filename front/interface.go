package front

import (
	"context"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
)

// NodeSteps runs a container orchestrator's (CO's) volume steps through the
// lifecycle; *operations.Operations implements it. Its errors are
// lifecycle errors (volume.Err*, operations.ErrStillMounted, context
// errors) or carry the driver's gRPC status (csiclient.RPCError); see
// errors.go for how they become gRPC codes.
type NodeSteps interface {
	// StageRequest stages a volume of driver as req asks.
	StageRequest(ctx context.Context, driver string, req *csi.NodeStageVolumeRequest) error
	// UnstageRequest unstages a volume of driver as req asks; a volume not
	// staged by a CO at req's path is left alone (nil).
	UnstageRequest(ctx context.Context, driver string, req *csi.NodeUnstageVolumeRequest) error
	// PublishRequest publishes a volume of driver for pseudo pod pod.
	PublishRequest(ctx context.Context, driver string, pod types.UID, req *csi.NodePublishVolumeRequest) error
	// UnpublishRequest unpublishes a volume of driver for pseudo pod pod; a
	// target not published by a CO is left alone (nil).
	UnpublishRequest(ctx context.Context, driver string, pod types.UID, req *csi.NodeUnpublishVolumeRequest) error
}

// NodeQueries answers a CO's other Node calls through the lifecycle;
// *operations.Operations implements it.
type NodeQueries interface {
	// VolumeStats returns the stats of a volume staged or published at
	// req's volume_path.
	VolumeStats(ctx context.Context, driver string, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error)
	// VolumeHealth returns the health of a volume this node staged or
	// published (at req's paths, when it names them).
	VolumeHealth(ctx context.Context, driver string, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error)
	// ExpandVolume expands a volume staged or published at req's volume_path.
	ExpandVolume(ctx context.Context, driver string, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error)
	// NodeCapabilities returns driver's node capabilities.
	NodeCapabilities(ctx context.Context, driver string) (csiclient.NodeCapabilities, error)
	// NodeInfo returns driver's NodeGetInfo answer.
	NodeInfo(ctx context.Context, driver string) (*csi.NodeGetInfoResponse, error)
}

// Operations is everything the Node service needs of the lifecycle.
type Operations interface {
	NodeSteps
	NodeQueries
}

var _ Operations = &operations.Operations{}

// Backend is the connection to the fronted driver; *csiclient.Client
// implements it. Its clients return the driver's errors unclassified, so
// they can be relayed verbatim.
type Backend interface {
	// Identity is the driver's Identity service.
	Identity() csi.IdentityClient
	// Controller is the driver's Controller service.
	Controller() csi.ControllerClient
	// GroupController is the driver's GroupController service.
	GroupController() csi.GroupControllerClient
}

var _ Backend = &csiclient.Client{}

// Drivers finds a registered driver's connection by name; the driver
// registry implements it.
type Drivers interface {
	// Client returns the connection of the named driver, false when it is
	// not registered now.
	Client(name string) (*csiclient.Client, bool)
}
