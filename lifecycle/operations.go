package lifecycle

import (
	"context"
	"sync"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
)

// Operations returns the operations Run builds once it has reconstructed
// the actual state, waiting until then or until ctx ends. The front
// endpoint (driver/front) runs a container orchestrator's steps through
// them: the same code, locks, actual state and records as the reconciler's.
func (m *Manager) Operations(ctx context.Context) (*operations.Operations, error) {
	return m.operations.wait(ctx)
}

// operationsHandle hands the operations Run builds to those waiting for
// them. The zero value is ready to use.
type operationsHandle struct {
	// mu guards ops and built.
	mu  sync.Mutex
	ops *operations.Operations
	// built is closed once ops is set; made on first use.
	built chan struct{}
}

// channel returns built, making it if needed; mu must be held.
func (h *operationsHandle) channel() chan struct{} {
	if h.built == nil {
		h.built = make(chan struct{})
	}
	return h.built
}

// set publishes ops to the waiters; only the first call counts.
func (h *operationsHandle) set(ops *operations.Operations) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ops != nil {
		return
	}
	h.ops = ops
	close(h.channel())
}

// wait returns the operations once set, or ctx's error.
func (h *operationsHandle) wait(ctx context.Context) (*operations.Operations, error) {
	h.mu.Lock()
	built := h.channel()
	h.mu.Unlock()
	select {
	case <-built:
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.ops, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
