package csiclient

import (
	"slices"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// NodeCapabilities is the set of node service RPC capabilities a driver
// advertised in NodeGetCapabilities. The zero value advertises nothing.
// It is immutable and safe to share.
type NodeCapabilities struct {
	rpcs map[csi.NodeServiceCapability_RPC_Type]struct{}
}

// NewNodeCapabilities returns a set holding types.
func NewNodeCapabilities(types ...csi.NodeServiceCapability_RPC_Type) NodeCapabilities {
	rpcs := make(map[csi.NodeServiceCapability_RPC_Type]struct{}, len(types))
	for _, t := range types {
		rpcs[t] = struct{}{}
	}
	return NodeCapabilities{rpcs: rpcs}
}

// nodeCapabilitiesFrom builds the set from a NodeGetCapabilities reply,
// skipping entries that are not RPC capabilities.
func nodeCapabilitiesFrom(resp *csi.NodeGetCapabilitiesResponse) NodeCapabilities {
	var types []csi.NodeServiceCapability_RPC_Type
	for _, c := range resp.GetCapabilities() {
		if rpc := c.GetRpc(); rpc != nil {
			types = append(types, rpc.GetType())
		}
	}
	return NewNodeCapabilities(types...)
}

// Has reports whether the driver advertised t.
func (c NodeCapabilities) Has(t csi.NodeServiceCapability_RPC_Type) bool {
	_, ok := c.rpcs[t]
	return ok
}

// StageUnstage reports STAGE_UNSTAGE_VOLUME: the driver needs
// NodeStageVolume before NodePublishVolume.
func (c NodeCapabilities) StageUnstage() bool {
	return c.Has(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
}

// Expand reports EXPAND_VOLUME: the driver implements NodeExpandVolume.
func (c NodeCapabilities) Expand() bool {
	return c.Has(csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
}

// Stats reports GET_VOLUME_STATS: the driver implements NodeGetVolumeStats.
func (c NodeCapabilities) Stats() bool {
	return c.Has(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS)
}

// VolumeMountGroup reports VOLUME_MOUNT_GROUP: the driver applies the pod's
// fsGroup itself through volume_mount_group.
func (c NodeCapabilities) VolumeMountGroup() bool {
	return c.Has(csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
}

// SingleNodeMultiWriter reports SINGLE_NODE_MULTI_WRITER: the driver
// understands the SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER
// access modes.
func (c NodeCapabilities) SingleNodeMultiWriter() bool {
	return c.Has(csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
}

// Types returns the advertised capabilities in ascending order.
func (c NodeCapabilities) Types() []csi.NodeServiceCapability_RPC_Type {
	types := make([]csi.NodeServiceCapability_RPC_Type, 0, len(c.rpcs))
	for t := range c.rpcs {
		types = append(types, t)
	}
	slices.Sort(types)
	return types
}

// String returns the capability names, e.g. "[STAGE_UNSTAGE_VOLUME EXPAND_VOLUME]".
func (c NodeCapabilities) String() string {
	names := make([]string, 0, len(c.rpcs))
	for _, t := range c.Types() {
		names = append(names, t.String())
	}
	return "[" + strings.Join(names, " ") + "]"
}
