package nodeinfo

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrNodeNotFound is returned by Install and EnsureCSINode when the Node
	// object does not exist (yet). The caller retries with backoff; the API
	// server's NotFound error is wrapped too.
	ErrNodeNotFound = errors.New("node object does not exist")

	// ErrInvalidDriverInfo is returned, before any API call, when a driver
	// name, node ID, volume limit or topology segment is not acceptable.
	ErrInvalidDriverInfo = errors.New("invalid driver info")
)

// LabelConflict is one topology segment whose key is already a Node label
// with a different value.
type LabelConflict struct {
	// Key is the label key.
	Key string
	// DriverValue is the value the driver reported.
	DriverValue string
	// NodeValue is the value the Node label has.
	NodeValue string
}

// TopologyConflictError rejects a driver registration whose topology
// segments collide with existing Node labels. Nothing has been changed in the
// API when it is returned.
type TopologyConflictError struct {
	// Driver is the driver name.
	Driver string
	// Node is the node name.
	Node string
	// Conflicts lists the colliding labels, sorted by key.
	Conflicts []LabelConflict
}

// Error implements error.
func (e *TopologyConflictError) Error() string {
	parts := make([]string, 0, len(e.Conflicts))
	for _, c := range e.Conflicts {
		parts = append(parts, fmt.Sprintf("driver reports %s=%q but the node has %s=%q", c.Key, c.DriverValue, c.Key, c.NodeValue))
	}
	return fmt.Sprintf("topology of CSI driver %q conflicts with labels of node %q: %s",
		e.Driver, e.Node, strings.Join(parts, "; "))
}
