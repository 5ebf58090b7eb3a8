package csiclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// DefaultTimeout is the per-call timeout used when Config.Timeout is zero.
// It matches the kubelet's csiTimeout.
const DefaultTimeout = 2 * time.Minute

// ErrInvalidConfig is wrapped by the error New returns for a Config it
// rejects (bad endpoint, negative timeout); retrying with the same Config
// cannot succeed.
var ErrInvalidConfig = errors.New("invalid csiclient config")

// Config describes one driver connection.
type Config struct {
	// DriverName is the CSI driver name. It labels logs ("driver"), errors
	// and metrics (driver_name); empty is allowed and recorded as
	// "unknown-driver" in metrics.
	DriverName string
	// Endpoint is the absolute path of the driver's unix socket, optionally
	// with a "unix://" prefix; see ParseEndpoint.
	Endpoint string
	// Timeout bounds every call whose context has no earlier deadline.
	// Zero means DefaultTimeout; negative is invalid.
	Timeout time.Duration
	// Metrics records csi_operations_seconds for every call; nil records
	// nothing. One Metrics is meant to be shared by all Clients.
	Metrics *Metrics
	// OnReconnect, when set, is called each time the connection is Ready
	// again after it was lost: the driver went away (a crash, a restart)
	// and answers at its socket again, whether or not anything called it
	// meanwhile. It runs on the Client's watcher goroutine and must not
	// block.
	OnReconnect func(*Client)
}

// Client is one persistent gRPC connection to a CSI driver's unix socket,
// with typed node calls that return classified errors (see errors.go).
//
// Every call, including those made through Identity, Controller and
// GroupController, goes through the same path: the request and reply are
// logged at V(5) with secrets and volume_context credentials replaced
// (redact.CSI; csi-lib-utils' LogGRPC interceptor is kept quiet, it strips
// csi_secret fields only) and, when Config.Metrics is set, the call's
// latency is recorded. Nothing
// else in this package logs a CSI message. Every call is bounded by
// Config.Timeout unless the caller's context ends earlier.
//
// When the connection breaks the Client reconnects by itself, without
// waiting for a call: a connection that went idle is asked to connect
// again, and while the driver stays unreachable calls fail with
// Unavailable (uncertain) and redials are retried with backoff capped at one
// second. A restarted driver is thus noticed as soon as it listens again
// (Config.OnReconnect). A Client is safe for concurrent use.
type Client struct {
	driver   string
	endpoint string
	timeout  time.Duration
	logger   klog.Logger
	// onReconnect is Config.OnReconnect.
	onReconnect func(*Client)

	conn *grpc.ClientConn
	// calls wraps conn with the per-call timeout; every generated client
	// below is built on it.
	calls           callConn
	identity        csi.IdentityClient
	node            csi.NodeClient
	controller      csi.ControllerClient
	groupController csi.GroupControllerClient

	// stopWatch ends the connection-state watcher, which closes watchDone.
	stopWatch context.CancelFunc
	watchDone chan struct{}

	closeOnce sync.Once
	closeErr  error

	capMu sync.Mutex
	// caps is the cached NodeGetCapabilities answer, nil when unknown.
	// Guarded by capMu.
	caps *NodeCapabilities
	// capGen counts invalidations. A NodeGetCapabilities answer is cached
	// only if capGen did not change while it was in flight, so an answer
	// from a connection that was lost meanwhile is never cached.
	// Guarded by capMu.
	capGen uint64
}

// New connects to the driver at cfg.Endpoint. It blocks until the first
// connection is up and returns an error if ctx ends first (or after the
// csi-lib-utils default of 30 s). Afterwards the Client reconnects by itself
// until Close; a lost connection invalidates the cached node capabilities
// and never exits the process.
//
// ctx only bounds the connection attempt; its logger is kept for the
// Client's background logging.
func New(ctx context.Context, cfg Config) (*Client, error) {
	endpoint, err := ParseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	timeout := cfg.Timeout
	switch {
	case timeout == 0:
		timeout = DefaultTimeout
	case timeout < 0:
		return nil, fmt.Errorf("%w: negative timeout %v", ErrInvalidConfig, timeout)
	}

	logger := klog.FromContext(ctx).WithValues("driver", cfg.DriverName)
	c := &Client{
		driver:      cfg.DriverName,
		endpoint:    endpoint,
		timeout:     timeout,
		logger:      logger,
		onReconnect: cfg.OnReconnect,
		watchDone:   make(chan struct{}),
	}

	// A nil *Metrics must become a nil interface, not a typed nil.
	var mm metrics.CSIMetricsManager
	if cfg.Metrics != nil {
		mm = cfg.Metrics.manager(cfg.DriverName)
	}
	conn, err := connection.Connect(klog.NewContext(ctx, logger), endpoint, mm,
		connection.OnConnectionLoss(c.onConnectionLoss))
	if err != nil {
		return nil, fmt.Errorf("connecting to CSI driver %q at %s: %w", cfg.DriverName, endpoint, err)
	}
	c.conn = conn
	c.calls = callConn{conn: conn, timeout: timeout}
	c.identity = csi.NewIdentityClient(c.calls)
	c.node = csi.NewNodeClient(c.calls)
	c.controller = csi.NewControllerClient(c.calls)
	c.groupController = csi.NewGroupControllerClient(c.calls)

	watchCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stopWatch = stop
	go c.watchConnection(watchCtx)

	logger.V(2).Info("Connected to CSI driver", "endpoint", endpoint)
	return c, nil
}

// Close closes the connection. Calls in flight and later calls fail with
// Canceled (uncertain). Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.stopWatch()
		<-c.watchDone
		c.closeErr = c.conn.Close()
	})
	return c.closeErr
}

// DriverName returns Config.DriverName.
func (c *Client) DriverName() string { return c.driver }

// Endpoint returns the socket path, without any "unix://" prefix.
func (c *Client) Endpoint() string { return c.endpoint }

// Identity returns a client for the driver's Identity service on this
// connection, with the same logging, metrics and timeout as the typed
// calls. Its errors are the driver's status errors, not classified.
func (c *Client) Identity() csi.IdentityClient { return c.identity }

// Controller returns a pass-through client for the driver's Controller
// service on this connection, with the same logging, metrics and timeout as
// the typed calls. Its errors are the driver's status errors, not
// classified, so they can be relayed verbatim.
func (c *Client) Controller() csi.ControllerClient { return c.controller }

// GroupController returns a pass-through client for the driver's
// GroupController service; see Controller.
func (c *Client) GroupController() csi.GroupControllerClient { return c.groupController }
