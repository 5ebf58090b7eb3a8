package csiclient

import (
	"context"

	"google.golang.org/grpc/connectivity"
)

// WaitForConnection blocks until done(state) holds for c's connection state
// or ctx ends. It asks an idle connection to connect, so waiting for Ready
// after a loss triggers the reconnect without making a call.
func WaitForConnection(ctx context.Context, c *Client, done func(connectivity.State) bool) error {
	for {
		state := c.conn.GetState()
		if done(state) {
			return nil
		}
		if state == connectivity.Idle {
			c.conn.Connect()
		}
		if !c.conn.WaitForStateChange(ctx, state) {
			return ctx.Err()
		}
	}
}
