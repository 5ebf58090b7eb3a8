package lifecycle

import (
	"context"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/populator"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
)

// mode is what differs between a node served from an API server
// (clusterMode) and a node without one (standaloneMode): where pods and the
// objects they reference come from, how volumes get attached, and where
// status goes. The populator, operations and reconciler around it are the
// same.
type mode interface {
	// inputs are what the populator, the operations and the reconciler
	// read and write in this mode.
	inputs() inputs
	// steps returns the steps the reconciler runs: ops itself, or ops
	// with the mode's own work around them.
	steps(ops *operations.Operations) reconciler.Operations
	// migrateRecords rewrites the mode's own durable records of an older
	// format in the current one and returns how many it rewrote. It is
	// called once, after the actual state was read with no record of a
	// newer format, before runOutputs.
	migrateRecords(ctx context.Context) int
	// runInputs runs the mode's sources, telling rec of their events,
	// until ctx ends. It starts while the actual state is still being
	// read from disk: nothing it runs may act on a volume or write a
	// status (rec only queues what it is told until it runs).
	runInputs(ctx context.Context, rec *reconciler.Reconciler)
	// runOutputs runs the rest of the mode's goroutines (status writers,
	// attachers, expansion), telling rec of the mode's events, until ctx
	// ends. It starts once the actual state is whole.
	runOutputs(ctx context.Context, rec *reconciler.Reconciler)
	// close releases what the mode holds; it is called once, after
	// runInputs and runOutputs returned or when the Manager could not be
	// built.
	close() error
}

// inputs are a mode's sources and outputs. The outputs status, events and
// inUse may be nil: nothing is written there.
type inputs struct {
	source populator.Source
	// node gives the node's labels for PVs' nodeAffinity; nil checks none.
	node        populator.NodeLabels
	attachments operations.Attachments
	secrets     operations.Secrets
	tokens      operations.Tokens
	status      reconciler.StatusWriter
	events      reconciler.EventRecorder
	inUse       reconciler.InUseReporter
	// expander completes publishes of volumes resized before the mount;
	// nil in standalone mode.
	expander reconciler.MountExpander
}
