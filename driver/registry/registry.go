package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/keymutex"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/nodeinfo"
)

// NodeInfoPublisher writes a registered driver into the API server (CSINode,
// Node annotation and labels) and removes it again. driver/nodeinfo.Manager
// implements it; it is nil in standalone mode.
type NodeInfoPublisher interface {
	// Install publishes the driver's node ID, topology and volume limit.
	Install(ctx context.Context, info nodeinfo.DriverInfo) error
	// Uninstall removes what Install published for the driver.
	Uninstall(ctx context.Context, driverName string) error
}

// Config configures a Registry.
type Config struct {
	// Dir is the registration directory (kubelet: <root>/plugins_registry).
	Dir string
	// NodeInfo publishes registered drivers; nil publishes nothing.
	NodeInfo NodeInfoPublisher
	// CSITimeout is the per-call timeout of the driver clients; 0 means csiclient's default.
	CSITimeout time.Duration
	// Metrics records csi_operations_seconds for every driver client; may be nil.
	Metrics *csiclient.Metrics
	// HandshakeTimeout bounds one registration attempt (GetInfo, connect,
	// NodeGetInfo, Install); 0 means 30s.
	HandshakeTimeout time.Duration
	// RetryBaseDelay and RetryMaxDelay bound the per-socket backoff; 0 means 500ms and 2m.
	RetryBaseDelay, RetryMaxDelay time.Duration
}

func (c *Config) setDefaults() error {
	if c.Dir == "" {
		return errors.New("registry: registration directory is required")
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 30 * time.Second
	}
	if c.RetryBaseDelay == 0 {
		c.RetryBaseDelay = 500 * time.Millisecond
	}
	if c.RetryMaxDelay == 0 {
		c.RetryMaxDelay = 2 * time.Minute
	}
	return nil
}

// Driver is a registered CSI driver.
type Driver struct {
	// Name is the CSI driver name.
	Name string
	// Endpoint is the path of the driver's CSI socket.
	Endpoint string
	// Version is the highest 1.x CSI version the driver offered.
	Version string
	// SupportedVersions is what the driver offered.
	SupportedVersions []string
	// NodeID, MaxVolumes and Topology come from NodeGetInfo.
	NodeID     string
	MaxVolumes int64
	Topology   map[string]string
	// RegistrationSocket is the socket the driver registered through.
	RegistrationSocket string
	// RegisteredAt is when the registration completed.
	RegisteredAt time.Time
	// Client is the persistent connection to the driver.
	Client *csiclient.Client

	version *utilversion.Version
}

// EventType says what happened to a driver.
type EventType int

const (
	// Registered means a driver completed registration, or re-registered with a
	// new connection (observers should reset backoff and re-verify its volumes).
	Registered EventType = iota + 1
	// Deregistered means a driver's registration socket disappeared.
	Deregistered
	// Rejected means a registration attempt failed; Err says why.
	Rejected
	// Reconnected means a registered driver's connection was lost and is
	// back, and the driver answers GetPluginInfo with its name again: the
	// driver restarted without registering again (its registrar kept
	// running). Observers should re-verify its volumes, as for Registered.
	Reconnected
)

func (t EventType) String() string {
	switch t {
	case Registered:
		return "Registered"
	case Deregistered:
		return "Deregistered"
	case Rejected:
		return "Rejected"
	case Reconnected:
		return "Reconnected"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event tells observers what happened to a driver.
type Event struct {
	Type EventType
	// Driver is the driver name; empty for a rejection before the name was known.
	Driver string
	// Socket is the registration socket involved.
	Socket string
	// Err is the reason of a rejection.
	Err error
}

// Registry holds the registered CSI drivers of this node.
type Registry struct {
	cfg   Config
	queue workqueue.TypedRateLimitingInterface[string]
	// nameLocks serializes registration and deregistration per driver name.
	nameLocks keymutex.KeyMutex

	// mu protects drivers, owners, observers, pendingInitial and retired.
	mu sync.RWMutex
	// retired holds the clients of replaced or deregistered registrations
	// until they are closed (see retire).
	retired map[*csiclient.Client]*time.Timer
	// drivers maps a driver name to its registration.
	drivers map[string]*Driver
	// owners maps a registration socket to the driver name it registered,
	// kept until the driver is uninstalled after the socket goes.
	owners    map[string]string
	observers []func(Event)
	// pendingInitial holds the sockets found by the initial walk that have
	// not been handled once yet; HasSynced is true when it is empty.
	pendingInitial map[string]struct{}
	walked         bool
}

// New returns a Registry; Run starts it.
func New(cfg Config) (*Registry, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBaseDelay, cfg.RetryMaxDelay)
	return &Registry{
		cfg:            cfg,
		queue:          workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "registration"}),
		nameLocks:      keymutex.NewHashed(0),
		drivers:        map[string]*Driver{},
		owners:         map[string]string{},
		pendingInitial: map[string]struct{}{},
	}, nil
}

// Subscribe registers fn to be told of every Event. fn runs on the
// registry's goroutines and must not block: enqueue and return.
func (r *Registry) Subscribe(fn func(Event)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observers = append(r.observers, fn)
}

// Client returns the connection to the named driver, if it is registered.
func (r *Registry) Client(name string) (*csiclient.Client, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, ok := r.drivers[name]
	if !ok {
		return nil, false
	}
	return d.Client, true
}

// Driver returns a copy of the named driver's registration.
func (r *Registry) Driver(name string) (Driver, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, ok := r.drivers[name]
	if !ok {
		return Driver{}, false
	}
	return d.copy(), true
}

// List returns copies of all registrations, sorted by name.
func (r *Registry) List() []Driver {
	r.mu.RLock()
	out := make([]Driver, 0, len(r.drivers))
	for _, d := range r.drivers {
		out = append(out, d.copy())
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Driver) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// HasSynced is true once every socket found at start has been handled once,
// whether it registered or not.
func (r *Registry) HasSynced() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.walked && len(r.pendingInitial) == 0
}

func (d *Driver) copy() Driver {
	c := *d
	c.SupportedVersions = slices.Clone(d.SupportedVersions)
	if d.Topology != nil {
		c.Topology = make(map[string]string, len(d.Topology))
		for k, v := range d.Topology {
			c.Topology[k] = v
		}
	}
	return c
}

func (r *Registry) notify(ev Event) {
	r.mu.RLock()
	observers := slices.Clone(r.observers)
	r.mu.RUnlock()
	for _, fn := range observers {
		fn(ev)
	}
}

// Run walks the registration directory, watches it and handles sockets until
// ctx ends. On return every driver connection is closed; nothing is
// uninstalled, since the drivers are still there for the next agent.
func (r *Registry) Run(ctx context.Context) error {
	if err := os.MkdirAll(r.cfg.Dir, 0o750); err != nil {
		return fmt.Errorf("registry: create registration directory: %w", err)
	}
	w, err := newWatcher(r.cfg.Dir, r.enqueue)
	if err != nil {
		return err
	}
	defer func() { _ = w.close() }()
	initial, err := w.walk(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	for _, p := range initial {
		r.pendingInitial[p] = struct{}{}
	}
	r.walked = true
	r.mu.Unlock()
	for _, p := range initial {
		r.queue.Add(p)
	}

	var wg sync.WaitGroup
	wg.Go(func() { w.run(ctx) })
	wg.Go(func() {
		<-ctx.Done()
		r.queue.ShutDown()
	})
	// Every socket taken from the queue is handled on its own goroutine, so
	// a socket that hangs holds nothing but itself; the queue hands out a
	// socket again only after Done, so one socket never has two handshakes.
	for {
		socket, shutdown := r.queue.Get()
		if shutdown {
			break
		}
		wg.Go(func() { r.handle(ctx, socket) })
	}
	wg.Wait()
	r.closeAll()
	return nil
}

func (r *Registry) enqueue(path string) { r.queue.Add(path) }

// handle runs one sync of socket and schedules its retry on failure.
func (r *Registry) handle(ctx context.Context, socket string) {
	defer r.queue.Done(socket)
	err := r.sync(ctx, socket)
	r.mu.Lock()
	delete(r.pendingInitial, socket)
	r.mu.Unlock()
	if err == nil || ctx.Err() != nil {
		r.queue.Forget(socket)
		return
	}
	r.queue.AddRateLimited(socket)
}

func (r *Registry) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.drivers {
		_ = d.Client.Close()
	}
	r.closeRetiredLocked()
}

// SetMaxVolumes records a registered driver's refreshed
// max_volumes_per_node (the CSINode's allocatable count was updated), so
// that Driver and List show it.
func (r *Registry) SetMaxVolumes(name string, maxVolumes int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.drivers[name]; ok {
		d.MaxVolumes = maxVolumes
	}
}
