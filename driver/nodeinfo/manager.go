package nodeinfo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// AnnotationNodeID is the Node annotation that maps driver names to the
// node IDs the drivers reported, as a JSON object.
const AnnotationNodeID = "csi.volume.kubernetes.io/nodeid"

// AnnotationTopologyLabels records, as a JSON object of driver name → label
// keys, which topology labels each driver owns, so that deregistration can
// remove them (the kubelet leaves them behind).
const AnnotationTopologyLabels = "csi-volmgr.io/topology-labels"

const (
	// maxDriverNameLength is the CSIDriver name limit of the API.
	maxDriverNameLength = 63
	// maxNodeIDLength is the CSINode nodeID limit of the API.
	maxNodeIDLength = 256
)

// DefaultBackoff is the retry schedule for conflicting writes when
// Config.Backoff is not set. It is the kubelet's nodeinfomanager schedule:
// 4 attempts, 10 ms growing ×5.
var DefaultBackoff = wait.Backoff{
	Steps:    4,
	Duration: 10 * time.Millisecond,
	Factor:   5.0,
	Jitter:   0.1,
}

// DriverInfo is what a registered driver reports about this node through
// NodeGetInfo.
type DriverInfo struct {
	// Name is the driver name: a DNS-1123 subdomain of at most 63
	// characters (case-insensitive).
	Name string
	// NodeID identifies this node to the driver; required, at most 256
	// characters.
	NodeID string
	// MaxVolumes is max_volumes_per_node; 0 means no limit. Values above
	// math.MaxInt32 are truncated, as the kubelet does.
	MaxVolumes int64
	// Topology is accessible_topology.segments: each key must be a valid
	// label key and each value a valid label value.
	Topology map[string]string
}

// Validate checks d without calling the API. Errors wrap
// ErrInvalidDriverInfo.
func (d DriverInfo) Validate() error {
	errs := validateDriverName(d.Name)
	switch {
	case d.NodeID == "":
		errs = append(errs, errors.New("node ID must not be empty"))
	case len(d.NodeID) > maxNodeIDLength:
		errs = append(errs, fmt.Errorf("node ID must be at most %d characters, got %d", maxNodeIDLength, len(d.NodeID)))
	}
	if d.MaxVolumes < 0 {
		errs = append(errs, fmt.Errorf("max volumes must not be negative, got %d", d.MaxVolumes))
	}
	keys := make([]string, 0, len(d.Topology))
	for k := range d.Topology {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, fmt.Errorf("topology key %q: %s", k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(d.Topology[k]) {
			errs = append(errs, fmt.Errorf("topology value %q of key %q: %s", d.Topology[k], k, msg))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidDriverInfo, errors.Join(errs...))
	}
	return nil
}

func validateDriverName(name string) []error {
	if name == "" {
		return []error{errors.New("driver name must not be empty")}
	}
	var errs []error
	if len(name) > maxDriverNameLength {
		errs = append(errs, fmt.Errorf("driver name %q must be at most %d characters", name, maxDriverNameLength))
	}
	// The API validates CSI driver names case-insensitively.
	for _, msg := range validation.IsDNS1123Subdomain(strings.ToLower(name)) {
		errs = append(errs, fmt.Errorf("driver name %q: %s", name, msg))
	}
	return errs
}

// Config configures a Manager.
type Config struct {
	// Client talks to the API server. Required.
	Client kubernetes.Interface
	// NodeName is the Node (and CSINode) this agent serves. Required.
	NodeName string
	// Backoff is the retry schedule for writes that hit a conflict.
	// Zero means DefaultBackoff.
	Backoff wait.Backoff
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("client is required"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is required"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(c.NodeName) {
			errs = append(errs, fmt.Errorf("node name %q: %s", c.NodeName, msg))
		}
	}
	return errors.Join(errs...)
}

// Manager publishes driver information for one node. Its methods are safe
// for concurrent use; calls are serialized within the Manager, and writes
// from other clients are handled by optimistic concurrency.
type Manager struct {
	client   kubernetes.Interface
	nodeName string
	backoff  wait.Backoff

	// mu serializes Install, Uninstall and EnsureCSINode so that this process
	// does not conflict with itself; it protects no fields.
	mu sync.Mutex
}

// New returns a Manager for cfg.NodeName.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid nodeinfo config: %w", err)
	}
	backoff := cfg.Backoff
	if backoff.Steps == 0 {
		backoff = DefaultBackoff
	}
	return &Manager{client: cfg.Client, nodeName: cfg.NodeName, backoff: backoff}, nil
}

// Install publishes a registered driver: it merges the driver's node ID into
// the Node annotation and sets its topology labels in one Node patch, then
// creates the CSINode if needed (owned by the Node) and sets or replaces the
// driver's entry in it.
//
// Install is idempotent and makes no write when everything is already
// published. It fails, before any write, when info is invalid
// (ErrInvalidDriverInfo), the Node does not exist (ErrNodeNotFound), or a
// topology segment collides with an existing label of a different value
// (*TopologyConflictError). If the CSINode write fails after the Node was
// patched, the caller retries Install.
func (m *Manager) Install(ctx context.Context, info DriverInfo) error {
	if err := info.Validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("driver", info.Name, "node", klog.KRef("", m.nodeName))
	ctx = klog.NewContext(ctx, logger)
	m.mu.Lock()
	defer m.mu.Unlock()

	node, err := m.updateNode(ctx, func(n *nodeMeta) error {
		if err := n.setNodeID(info.Name, info.NodeID); err != nil {
			return err
		}
		return n.setTopologyLabels(info.Name, m.nodeName, info.Topology)
	})
	if err != nil {
		return fmt.Errorf("publishing CSI driver %q on Node %q: %w", info.Name, m.nodeName, err)
	}
	entry := csiNodeEntry(ctx, info)
	if err := m.updateCSINode(ctx, node, func(drivers []storagev1.CSINodeDriver) []storagev1.CSINodeDriver {
		return setDriver(drivers, entry)
	}); err != nil {
		return fmt.Errorf("publishing CSI driver %q in CSINode %q: %w", info.Name, m.nodeName, err)
	}
	logger.V(2).Info("Published CSI driver node info", "nodeID", info.NodeID,
		"maxVolumes", info.MaxVolumes, "topology", info.Topology)
	return nil
}

// Uninstall removes what Install published for driverName: its CSINode
// entry, its key in the node ID annotation (the annotation is removed when no
// driver is left), and the topology labels it owns that no other driver owns
// (see AnnotationTopologyLabels; the kubelet leaves topology labels behind).
// A label that existed before the driver registered is kept. A missing
// CSINode, Node or entry is not an error. The CSINode object itself is kept
// even when it has no drivers left, as the kubelet does.
func (m *Manager) Uninstall(ctx context.Context, driverName string) error {
	if errs := validateDriverName(driverName); len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidDriverInfo, errors.Join(errs...))
	}
	logger := klog.FromContext(ctx).WithValues("driver", driverName, "node", klog.KRef("", m.nodeName))
	ctx = klog.NewContext(ctx, logger)
	m.mu.Lock()
	defer m.mu.Unlock()

	if err := m.updateCSINode(ctx, nil, func(drivers []storagev1.CSINodeDriver) []storagev1.CSINodeDriver {
		return removeDriver(drivers, driverName)
	}); err != nil {
		return fmt.Errorf("removing CSI driver %q from CSINode %q: %w", driverName, m.nodeName, err)
	}
	_, err := m.updateNode(ctx, func(n *nodeMeta) error {
		if err := n.removeNodeID(driverName); err != nil {
			return err
		}
		return n.removeTopologyLabels(driverName)
	})
	if err != nil && !errors.Is(err, ErrNodeNotFound) {
		return fmt.Errorf("removing CSI driver %q from Node %q: %w", driverName, m.nodeName, err)
	}
	logger.V(2).Info("Removed CSI driver node info")
	return nil
}

// EnsureCSINode creates the node's CSINode object, owned by the Node, if it
// does not exist, and replaces a stale one left behind by an earlier Node
// object of the same name. The kubelet does this at start-up, before any
// driver registers, so that the scheduler sees the node's CSI state.
func (m *Manager) EnsureCSINode(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", klog.KRef("", m.nodeName))
	ctx = klog.NewContext(ctx, logger)
	m.mu.Lock()
	defer m.mu.Unlock()

	node, err := m.getNode(ctx)
	if err != nil {
		return fmt.Errorf("ensuring CSINode %q: %w", m.nodeName, err)
	}
	if err := m.updateCSINode(ctx, node, func(drivers []storagev1.CSINodeDriver) []storagev1.CSINodeDriver {
		return drivers
	}); err != nil {
		return fmt.Errorf("ensuring CSINode %q: %w", m.nodeName, err)
	}
	return nil
}

// allocatableCount converts max_volumes_per_node to the CSINode allocatable
// count: nil for "no limit", truncated to math.MaxInt32.
func allocatableCount(ctx context.Context, maxVolumes int64) *int32 {
	if maxVolumes <= 0 {
		return nil
	}
	if maxVolumes > math.MaxInt32 {
		klog.FromContext(ctx).Info("Truncating max volumes per node to the CSINode limit",
			"maxVolumes", maxVolumes, "limit", math.MaxInt32)
		maxVolumes = math.MaxInt32
	}
	c := int32(maxVolumes)
	return &c
}
