package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// DefaultName is the driver name the plugin reports when Config.Name is empty.
const DefaultName = "testplugin.csi-volmgr.io"

// DefaultCapacity is the total capacity (1 TiB) reported by GetCapacity when Config.Capacity is zero.
// Volumes are sparse, so it costs no disk space.
const DefaultCapacity int64 = 1 << 40

// defaultVolumeSize is the size of a volume created without a capacity range.
const defaultVolumeSize int64 = 1 << 30

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("invalid plugin configuration")

// Capabilities selects the optional CSI capabilities the plugin advertises and honours.
// CREATE_DELETE_VOLUME, LIST_VOLUMES and GET_CAPACITY are always advertised.
type Capabilities struct {
	// StageUnstage advertises the node capability STAGE_UNSTAGE_VOLUME.
	StageUnstage bool
	// Expand advertises the node and controller capability EXPAND_VOLUME.
	Expand bool
	// VolumeStats advertises the node capability GET_VOLUME_STATS.
	VolumeStats bool
	// VolumeHealth advertises the node capability GET_VOLUME_HEALTH: NodeGetVolumeHealth reports the
	// conditions the control file sets for a volume, and a broken mount.
	VolumeHealth bool
	// VolumeMountGroup advertises the node capability VOLUME_MOUNT_GROUP.
	VolumeMountGroup bool
	// SingleNodeMultiWriter advertises SINGLE_NODE_MULTI_WRITER on the node and the controller service.
	SingleNodeMultiWriter bool
	// ControllerPublish advertises the controller capabilities PUBLISH_UNPUBLISH_VOLUME and PUBLISH_READONLY.
	// With it on, NodeStageVolume and NodePublishVolume reject calls without the publish_context
	// that ControllerPublishVolume returned.
	ControllerPublish bool
	// NodeOnly advertises no CONTROLLER_SERVICE plugin capability, as a node-only plugin (an NFS
	// or secrets-store node plugin) does. The controller RPCs still answer, so that a test can
	// create a volume out of band and hand its ID to a CO as a pre-provisioned volume.
	NodeOnly bool
}

// DefaultCapabilities returns the capabilities the plugin has when no flag changes them: only STAGE_UNSTAGE_VOLUME.
func DefaultCapabilities() Capabilities {
	return Capabilities{StageUnstage: true}
}

// AllCapabilities returns every optional capability switched on.
func AllCapabilities() Capabilities {
	return Capabilities{
		StageUnstage:          true,
		Expand:                true,
		VolumeStats:           true,
		VolumeHealth:          true,
		VolumeMountGroup:      true,
		SingleNodeMultiWriter: true,
		ControllerPublish:     true,
	}
}

// Config is everything one plugin instance needs. Build it from flags and call Validate before New.
type Config struct {
	// Name is the driver name reported by GetPluginInfo and the plugin-registration API.
	Name string
	// VendorVersion is reported by GetPluginInfo.
	VendorVersion string
	// NodeID is reported by NodeGetInfo and is the only node ControllerPublishVolume accepts.
	NodeID string
	// Endpoint is the path of the unix socket serving CSI. A "unix://" or "unix:" prefix is accepted.
	Endpoint string
	// StateDir holds the state file and the volumes' backing directories and image files.
	StateDir string
	// MaxVolumesPerNode is reported by NodeGetInfo and enforced by ControllerPublishVolume; 0 means no limit.
	// The control file's maxVolumesPerNode replaces it while set.
	MaxVolumesPerNode int64
	// Topology is the accessible topology of the node; empty disables VOLUME_ACCESSIBILITY_CONSTRAINTS.
	Topology map[string]string
	// Capacity is the total capacity in bytes; 0 means DefaultCapacity.
	Capacity int64
	// Capabilities selects the optional capabilities.
	Capabilities Capabilities
	// RegistrationDir, when set, is where the plugin-registration socket <Name>-reg.sock is served.
	RegistrationDir string
	// ControlFile, when set, is the JSON fault-injection file (see the package documentation).
	ControlFile string
	// JournalPath, when set, is the JSON-lines call journal (see the package documentation).
	JournalPath string
	// VolumeDirMode is the mode of a new filesystem volume's directory (owned by root); 0 means 0777,
	// writable by any pod. 0755 stands for the drivers whose volumes are freshly made filesystems
	// (EBS, Ceph RBD and most block-backed drivers: mkfs leaves the root directory root:root 0755),
	// where a non-root pod can write only once its fsGroup was applied.
	VolumeDirMode os.FileMode
}

// Validate fills defaults, normalizes paths and checks the configuration.
// Every error it returns wraps ErrInvalidConfig.
func (c *Config) Validate() error {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Capacity == 0 {
		c.Capacity = DefaultCapacity
	}
	if c.NodeID == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("%w: node ID not set and hostname unknown: %w", ErrInvalidConfig, err)
		}
		c.NodeID = host
	}
	c.Endpoint = SocketPath(c.Endpoint)
	var errs []error
	if c.Endpoint == "" {
		errs = append(errs, errors.New("endpoint is required"))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("state directory is required"))
	}
	if c.Capacity < 0 {
		errs = append(errs, fmt.Errorf("capacity %d is negative", c.Capacity))
	}
	if c.VolumeDirMode&^os.ModePerm != 0 {
		errs = append(errs, fmt.Errorf("volume directory mode %#o has bits other than the permissions", c.VolumeDirMode))
	}
	if c.MaxVolumesPerNode < 0 {
		errs = append(errs, fmt.Errorf("max volumes per node %d is negative", c.MaxVolumesPerNode))
	}
	for k, v := range c.Topology {
		if k == "" || v == "" {
			errs = append(errs, fmt.Errorf("topology segment %q=%q has an empty key or value", k, v))
		}
	}
	if c.RegistrationDir != "" {
		if n := len(RegistrationSocket(c.RegistrationDir, c.Name)); n > maxSocketPath {
			errs = append(errs, fmt.Errorf("registration socket path is %d bytes, the limit is %d", n, maxSocketPath))
		}
	}
	if n := len(c.Endpoint); n > maxSocketPath {
		errs = append(errs, fmt.Errorf("endpoint path is %d bytes, the limit is %d", n, maxSocketPath))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// maxSocketPath is the longest path a unix socket address can hold (sun_path is 108 bytes with a NUL).
const maxSocketPath = 107

// SocketPath strips a "unix://" or "unix:" scheme from a CSI endpoint and returns the socket path.
func SocketPath(endpoint string) string {
	for _, prefix := range []string{"unix://", "unix:"} {
		if rest, ok := strings.CutPrefix(endpoint, prefix); ok {
			return rest
		}
	}
	return endpoint
}

// RegistrationSocket returns the path of the plugin-registration socket a plugin named name serves
// in dir: <dir>/<name>-reg.sock, as node-driver-registrar names it.
func RegistrationSocket(dir, name string) string {
	return filepath.Join(dir, name+"-reg.sock")
}

// ParseTopology parses "key=value,key2=value2" into a map. An empty string yields an empty map.
func ParseTopology(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%w: topology segment %q is not key=value", ErrInvalidConfig, pair)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%w: topology key %q given twice", ErrInvalidConfig, k)
		}
		out[k] = v
	}
	return out, nil
}

// FormatTopology is the inverse of ParseTopology, with keys sorted.
func FormatTopology(t map[string]string) string {
	pairs := make([]string, 0, len(t))
	for k, v := range t {
		pairs = append(pairs, k+"="+v)
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}
