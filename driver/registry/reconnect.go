package registry

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// reconnectRetryDelay is the pause between two GetPluginInfo attempts of a
// driver whose connection came back.
const reconnectRetryDelay = 500 * time.Millisecond

// reconnected confirms that the driver behind a registered connection that
// was lost and is back answers again with its name, and then tells the
// observers (Reconnected): a driver container restarted next to a registrar
// that kept running registers no more, and this is the only sign of its
// restart (kubernetes#96361: the mounts of a FUSE driver die with it).
// GetPluginInfo is tried until the handshake timeout; a driver that does not
// answer, or answers with another name, is left to its registrar.
func (r *Registry) reconnected(ctx context.Context, name, socket string, c *csiclient.Client) {
	logger := klog.FromContext(ctx).WithValues("driver", name, "socket", socket)
	deadline := time.Now().Add(r.cfg.HandshakeTimeout)
	var err error
	for {
		if !r.current(name, c) {
			return // replaced or deregistered meanwhile: that registration speaks for the driver
		}
		if err = confirmName(ctx, c, name); err == nil {
			break
		}
		if time.Now().Add(reconnectRetryDelay).After(deadline) {
			logger.Error(err, "CSI driver's connection is back but the driver does not answer as itself; waiting for its registrar")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(reconnectRetryDelay):
		}
	}
	logger.Info("CSI driver answers again after its connection was lost; it may have restarted without registering again")
	r.notify(Event{Type: Reconnected, Driver: name, Socket: socket})
}

// current says whether c is the connection of name's current registration.
func (r *Registry) current(name string, c *csiclient.Client) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, ok := r.drivers[name]
	return ok && d.Client == c
}

// confirmName asks the driver for its name.
func confirmName(ctx context.Context, c *csiclient.Client, name string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	info, err := c.GetPluginInfo(ctx)
	if err != nil {
		return fmt.Errorf("GetPluginInfo: %w", err)
	}
	if got := info.GetName(); got != name {
		return fmt.Errorf("GetPluginInfo names driver %q, not the registered %q", got, name)
	}
	return nil
}
