package plugin

import (
	"context"
	"errors"
	"maps"
	"sync"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
)

// PublishContextDevicePath is the publish_context key ControllerPublishVolume returns: the volume's
// backing directory or image file. NodeStageVolume and NodePublishVolume require it to match when the
// ControllerPublish capability is on.
const PublishContextDevicePath = "devicePath"

// driver is the state shared by the identity, controller and node services.
// Every handler checks its arguments first, then takes the volume's lock, then does I/O.
type driver struct {
	cfg        Config
	volumesDir string
	store      *store
	mounter    mount.Interface

	// locks serializes operations on one volume (keyed by ID) and CreateVolume per name (keyed by "name/"+name).
	locks keyMutex
	// fuse serves the FUSE mounts of FUSE-backed volumes (FuseParameter).
	fuse fuseServers
	// faults, when set, holds the control file's runtime knobs (volume conditions, max volumes, bugs).
	faults *faultInjector
	// staging and publishing hold the volumes whose stage or publish runs, for the bugs that
	// look at them (BugStageInProgressOK, BugFailConcurrentPublish).
	staging, publishing sync.Map
}

// volumeSource is what a mount of the volume shows: the backing directory for a filesystem volume,
// the loop device for a block volume ("" when none is attached).
func (d *driver) volumeSource(v *Volume) (string, error) {
	if v.AccessType == AccessMount {
		return v.Path, nil
	}
	dev, err := loopdev.Find(v.Path)
	if errors.Is(err, loopdev.ErrNotFound) {
		return "", nil
	}
	return dev, err
}

// accessType returns the access type a capability asks for.
func accessType(c *csi.VolumeCapability) AccessType {
	if c.GetBlock() != nil {
		return AccessBlock
	}
	return AccessMount
}

// checkCapability validates one volume capability against what the plugin supports.
// It returns an InvalidArgument status error.
func (d *driver) checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "volume capability missing in request")
	}
	if c.GetBlock() == nil && c.GetMount() == nil {
		return status.Error(codes.InvalidArgument, "volume capability has no access type")
	}
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return status.Error(codes.InvalidArgument, "volume capability has no access mode")
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		if !d.cfg.Capabilities.SingleNodeMultiWriter {
			return status.Errorf(codes.InvalidArgument, "access mode %s needs the SINGLE_NODE_MULTI_WRITER capability", c.GetAccessMode().GetMode())
		}
	}
	if c.GetMount().GetVolumeMountGroup() != "" && !d.cfg.Capabilities.VolumeMountGroup {
		return status.Error(codes.InvalidArgument, "volume_mount_group is set but the VOLUME_MOUNT_GROUP capability is off")
	}
	return nil
}

// checkAccessType rejects a capability whose access type differs from the volume's.
func checkAccessType(v *Volume, c *csi.VolumeCapability) error {
	if got := accessType(c); got != v.AccessType {
		return status.Errorf(codes.InvalidArgument, "volume %s has access type %s, the request asks for %s", v.ID, v.AccessType, got)
	}
	return nil
}

// publishContext is what ControllerPublishVolume returns for a volume.
func publishContext(v *Volume) map[string]string {
	return map[string]string{PublishContextDevicePath: v.Path}
}

// checkPublishContext proves that ControllerPublishVolume happened for this node and that its
// publish_context reached the node call. It is a no-op without the ControllerPublish capability.
func (d *driver) checkPublishContext(v *Volume, pc map[string]string) error {
	if !d.cfg.Capabilities.ControllerPublish {
		return nil
	}
	if _, ok := v.Attachments[d.cfg.NodeID]; !ok {
		return status.Errorf(codes.FailedPrecondition, "volume %s is not controller-published to node %s", v.ID, d.cfg.NodeID)
	}
	if want := publishContext(v); !maps.Equal(pc, want) {
		return status.Errorf(codes.FailedPrecondition, "publish_context %v does not match the one ControllerPublishVolume returned (%v)", pc, want)
	}
	return nil
}

// ioStatus turns an I/O error into an Internal status error, keeping errForeignMount distinguishable.
func ioStatus(err error) error {
	if errors.Is(err, errForeignMount) {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// notFound is the NotFound status error for an unknown volume ID.
func notFound(id string) error {
	return status.Errorf(codes.NotFound, "volume %s not found", id)
}

// topologyMatches reports whether every segment of t is a segment of the node's topology.
func (d *driver) topologyMatches(t *csi.Topology) bool {
	for k, v := range t.GetSegments() {
		if d.cfg.Topology[k] != v {
			return false
		}
	}
	return true
}

// nodeTopology is the node's accessible topology, nil when none is configured.
func (d *driver) nodeTopology() *csi.Topology {
	if len(d.cfg.Topology) == 0 {
		return nil
	}
	return &csi.Topology{Segments: maps.Clone(d.cfg.Topology)}
}

// maxVolumes is the node's volume limit: the control file's maxVolumesPerNode while it sets one,
// else Config.MaxVolumesPerNode.
func (d *driver) maxVolumes(ctx context.Context) int64 {
	if n, ok := d.faults.maxVolumesOverride(ctx); ok {
		return n
	}
	return d.cfg.MaxVolumesPerNode
}
