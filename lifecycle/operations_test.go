package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
)

func TestOperationsHandle(t *testing.T) {
	var h operationsHandle
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, err := h.wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait before set = %v, want the context's error", err)
	}
	got := make(chan *operations.Operations)
	go func() {
		ops, err := h.wait(t.Context())
		if err != nil {
			t.Error(err)
		}
		got <- ops
	}()
	ops := &operations.Operations{}
	h.set(ops)
	h.set(&operations.Operations{}) // only the first counts
	if g := <-got; g != ops {
		t.Errorf("wait = %p, want the operations set first (%p)", g, ops)
	}
	if g, err := h.wait(t.Context()); err != nil || g != ops {
		t.Errorf("wait after set = %p, %v", g, err)
	}
}
