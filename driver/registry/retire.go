package registry

import (
	"time"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// retire closes a client that a re-registration replaced, or whose driver
// deregistered, one per-call timeout after it stopped being handed out:
// every call is bounded by that timeout, so the calls in flight end on
// their own first. Closing it at once would fail the lifecycle steps in
// flight with Canceled ("the client connection is closing"), leave them
// uncertain and repeat them, although the driver may never have gone away
// (a registrar restart, a repeated registration); the kubelet opens a
// connection per operation and has no such window. Run's end closes
// whatever is still waiting.
func (r *Registry) retire(c *csiclient.Client) {
	grace := r.cfg.CSITimeout
	if grace <= 0 {
		grace = csiclient.DefaultTimeout
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retired == nil {
		r.retired = map[*csiclient.Client]*time.Timer{}
	}
	if _, ok := r.retired[c]; ok {
		return
	}
	r.retired[c] = time.AfterFunc(grace, func() {
		r.mu.Lock()
		delete(r.retired, c)
		r.mu.Unlock()
		_ = c.Close()
	})
}

// closeRetiredLocked closes every retired client now; r.mu must be held.
func (r *Registry) closeRetiredLocked() {
	for c, t := range r.retired {
		t.Stop()
		_ = c.Close()
		delete(r.retired, c)
	}
}
