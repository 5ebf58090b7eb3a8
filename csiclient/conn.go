package csiclient

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient/redact"
)

const (
	// unixScheme is the optional prefix of Config.Endpoint.
	unixScheme = "unix://"
	// maxSocketPath is the longest path a unix socket address can hold on
	// Linux: sun_path is 108 bytes including the terminating NUL.
	maxSocketPath = 107
)

// ParseEndpoint returns the socket path of a driver endpoint given as an
// absolute path ("/var/lib/kubelet/plugins/x/csi.sock") or as a unix URL
// ("unix:///var/lib/kubelet/plugins/x/csi.sock"). The path is cleaned. Any
// other scheme, a relative path, a NUL byte or a path too long for a unix
// socket address is an error wrapping ErrInvalidConfig.
func ParseEndpoint(endpoint string) (string, error) {
	path := strings.TrimPrefix(endpoint, unixScheme)
	switch {
	case path == "":
		return "", fmt.Errorf("%w: empty endpoint", ErrInvalidConfig)
	case strings.ContainsRune(path, 0):
		return "", fmt.Errorf("%w: endpoint %q contains a NUL byte", ErrInvalidConfig, endpoint)
	case !filepath.IsAbs(path):
		return "", fmt.Errorf("%w: endpoint %q is not an absolute unix socket path", ErrInvalidConfig, endpoint)
	}
	path = filepath.Clean(path)
	if len(path) > maxSocketPath {
		return "", fmt.Errorf("%w: endpoint %q is longer than %d bytes", ErrInvalidConfig, endpoint, maxSocketPath)
	}
	return path, nil
}

// callConn applies the per-call timeout and hands the call to the
// connection, whose interceptors log and record it.
type callConn struct {
	conn    *grpc.ClientConn
	timeout time.Duration
}

var _ grpc.ClientConnInterface = callConn{}

// Invoke implements grpc.ClientConnInterface. The call gets a deadline of
// now+timeout unless ctx already has an earlier one. The request and the
// reply are logged here at V(5), with secrets and volume_context
// credentials replaced (redact.CSI); csi-lib-utils' own LogGRPC, which
// strips only csi_secret fields, gets a logger that keeps it quiet.
func (c callConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	logger := klog.FromContext(ctx)
	logger.V(5).Info("GRPC call", "method", method, "request", redact.CSI(args))
	err := c.conn.Invoke(redact.Quiet(ctx, redact.CSIMessages), method, args, reply, opts...)
	logger.V(5).Info("GRPC response", "method", method, "response", redact.CSI(reply), "err", err)
	return err
}

// NewStream implements grpc.ClientConnInterface. CSI has no streaming
// methods among those this package uses; streams get no timeout because
// their lifetime is not bounded by this call.
func (c callConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.conn.NewStream(ctx, desc, method, opts...)
}

// onConnectionLoss is the csi-lib-utils OnConnectionLoss callback, run when
// gRPC redials after losing the connection. It invalidates the cached
// capabilities and keeps reconnecting: the driver may be restarting with
// different capabilities.
func (c *Client) onConnectionLoss(context.Context) bool {
	c.InvalidateCapabilities()
	return true
}

// watchConnection invalidates the cached capabilities as soon as the
// connection leaves Ready, which gRPC reports before any redial, logs
// losses and recoveries, and keeps the connection up: gRPC leaves a lost
// connection idle until the next call, so a driver that restarts while
// nothing calls it would go unnoticed; an idle connection is asked to
// connect again at once (gRPC's backoff paces the attempts). A recovery
// is reported to Config.OnReconnect. It returns when ctx ends or the
// connection shuts down.
func (c *Client) watchConnection(ctx context.Context) {
	defer close(c.watchDone)
	state := c.conn.GetState()
	lost := state != connectivity.Ready
	for {
		if state == connectivity.Idle {
			c.conn.Connect()
		}
		if !c.conn.WaitForStateChange(ctx, state) {
			return
		}
		next := c.conn.GetState()
		switch {
		case next == connectivity.Shutdown:
			return
		case next != connectivity.Ready && !lost:
			lost = true
			c.InvalidateCapabilities()
			c.logger.Info("Lost connection to CSI driver", "endpoint", c.endpoint, "state", next.String())
		case next == connectivity.Ready && lost:
			lost = false
			c.logger.Info("Reconnected to CSI driver", "endpoint", c.endpoint)
			if c.onReconnect != nil {
				c.onReconnect(c)
			}
		}
		state = next
	}
}

// connected reports whether the connection is up right now.
func (c *Client) connected() bool {
	return c.conn.GetState() == connectivity.Ready
}
