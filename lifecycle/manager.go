package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/mountcheck"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/populator"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconstruct"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/republish"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/runtimepods"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/stats"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Drivers is the lifecycle's view of the CSI drivers registered on the
// node. The lifecycle never sees how drivers are found; the wiring adapts
// the driver registry to this.
type Drivers interface {
	// Client returns a registered driver's connection, false when the
	// driver is not registered.
	Client(name string) (*csiclient.Client, bool)
	// NodeID returns the node ID a registered driver reported in
	// NodeGetInfo, false when the driver is not registered.
	NodeID(name string) (string, bool)
	// OnRegistered subscribes fn to every registration of a driver,
	// re-registrations (a new connection) included. fn must not block.
	OnRegistered(fn func(driver string))
	// OnReconnected subscribes fn to every recovery of a registered
	// driver's lost connection, once the driver answers again: a driver
	// that restarted without registering again (its registrar kept
	// running). fn must not block.
	OnReconnected(fn func(driver string))
}

// Policies gives drivers' CSIDriver policies (volume.PolicyFromCSIDriver
// of each driver's object); the wiring adapts the driver layer's CSIDriver
// cache to this, standalone mode reads the manifests.
type Policies interface {
	// Get returns the named driver's policy, the kubelet's defaults when
	// it has no CSIDriver object.
	Get(driverName string) volume.Policy
	// OnChange subscribes fn to changes of a driver's policy; fn must not
	// block.
	OnChange(fn func(driverName string))
	// HasSynced tells whether Get answers from the complete set of
	// CSIDriver objects.
	HasSynced() bool
}

// Config configures a Manager.
type Config struct {
	// Client talks to the API server. Exactly one of Client and Standalone
	// is set.
	Client kubernetes.Interface
	// ReportClient, when set, writes what the agent reports — the pods'
	// VolumesReady conditions and the Events — instead of Client. A client
	// of its own has a rate limiter of its own: a burst of pods, whose
	// condition writes would take Client's budget, then never delays the
	// reads their volumes wait for. Cluster mode only.
	ReportClient kubernetes.Interface
	// Standalone, instead of Client, runs the node without an API server:
	// pods and the objects they reference come from it (a manifest
	// directory), volumes are attached by the agent itself
	// (lifecycle/localattach), and status goes to logs, Snapshot and the
	// metrics only.
	Standalone StandaloneSource
	// NodeName is the node whose pods this agent serves.
	NodeName string
	// RootDir is the agent's root directory (kubelet layout below it).
	RootDir string
	// Drivers and Policies are the driver layer, as the lifecycle sees it.
	Drivers  Drivers
	Policies Policies
	// Registerer receives the lifecycle metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// RemoveTerminatingPods tears down the volumes of pods marked for
	// deletion, for nodes that have no kubelet.
	RemoveTerminatingPods bool
	// WaitForContainersStopped is set when a runtime runs the pods'
	// containers: a pod's volumes are torn down once the runtime said its
	// containers stopped (ContainersStopped, or a RunningPods report
	// without the pod) or the pod is terminal, never only because it is
	// marked for deletion or gone from the API server
	// (lifecycle/runtimepods).
	WaitForContainersStopped bool
	// PodObserver, when set, is told of every change of a pod's volumes.
	PodObserver PodObserver
	// CompletePodDeletion deletes a pod marked for deletion (grace period
	// 0, UID precondition) once its volumes are torn down, as a kubelet does
	// after its containers stop: for nodes where the agent is the only
	// agent. It needs Client and RemoveTerminatingPods.
	CompletePodDeletion bool
	// ClusterWideInformers caches every PVC, PV and VolumeAttachment instead
	// of watching the referenced ones by name (small clusters only).
	ClusterWideInformers bool
	// SettledObjectResync, when positive, ends the by-name watch of a
	// referenced object once it settled and reads it again about this
	// often instead (source.Config.SettledObjectResync); 0 watches every
	// referenced object while it is referenced.
	SettledObjectResync time.Duration
	// GetOnly reads the referenced PVCs, PVs and VolumeAttachments with GETs
	// only, never a LIST or a WATCH (source.Config.GetOnly): how the agent
	// reads as its Node (system:node:<name>, group system:nodes) under the
	// API server's Node authorizer, the way the kubelet reads. An object
	// that has not settled is polled instead of watched. It needs a
	// positive SettledObjectResync and excludes ClusterWideInformers
	// (cluster mode).
	GetOnly bool
	// NodeKept tells that a node keeper (volumemanager's --register-node)
	// tells NodeOwner's Gate of every version of the Node; cluster mode then
	// tells it nothing, so that the Gate hears one informer's versions in
	// order. Otherwise cluster mode tells it of every version, UID included.
	NodeKept bool
	// ResyncPeriod is the reconciler's periodic resync; 0 means 5m.
	ResyncPeriod time.Duration
	// Changes tunes what is done for volumes that change while in use.
	Changes ChangesConfig
	// AttachLimits, when set, is told of attaches that failed for the
	// node's volume limit (cluster mode).
	AttachLimits AttachLimits
	// SELinux turns pods' SELinux options into the context= their PVs are
	// mounted with; nil asks the host (selinux.Host).
	SELinux selinux.Translator
	// SELinuxMountReadWriteOncePodOnly, when set and true, mounts only
	// ReadWriteOncePod PVs with an SELinux context, as the kubelet before
	// 1.37 (populator.Config); nil mounts every access mode with one.
	SELinuxMountReadWriteOncePodOnly func() bool
	// Reconciler tunes the reconciler (workers, backoff); the wiring fields
	// are filled in by the Manager. Reconciler.Ready, when set, is told of
	// every pod whose volumes became ready, besides the Manager's metrics.
	Reconciler reconciler.Config
}

func (c *Config) validate() error {
	var errs []error
	if (c.Client == nil) == (c.Standalone == nil) {
		errs = append(errs, errors.New("exactly one of client and standalone source is required"))
	}
	if c.CompletePodDeletion && (c.Client == nil || !c.RemoveTerminatingPods) {
		errs = append(errs, errors.New("completing pod deletion needs a client and RemoveTerminatingPods"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if c.Drivers == nil || c.Policies == nil {
		errs = append(errs, errors.New("drivers and policies are required"))
	}
	if c.Registerer == nil {
		// Nobody gathers this registry: the metrics are recorded and dropped.
		c.Registerer = prometheus.NewRegistry()
	}
	return errors.Join(errs...)
}

// Manager runs the volume lifecycle of one node. New builds every part in
// dependency order (the mode's inputs, the populator, the operations, the
// reconciler) and connects them; Run rebuilds the actual state from disk
// while the sources and the populator build the desired state, and then
// runs the rest.
type Manager struct {
	cfg     Config
	layout  paths.Layout
	mounter mount.Interface
	world   *asw.World
	desire  *dsw.Store
	mode    mode
	pop     *populator.Populator
	ops     *operations.Operations
	rec     *reconciler.Reconciler
	checker *mountcheck.Checker
	stats   *stats.Collector
	// republisher publishes requiresRepublish drivers' volumes again.
	republisher *republish.Republisher
	// owner tells whether the agent owns its Node: always in standalone
	// mode, while the Node carries nodeowner.Label in cluster mode.
	owner *nodeowner.Gate
	// holds is the runtime's word on its pods; nil without
	// WaitForContainersStopped.
	holds *runtimepods.Pods

	// reconstructed is closed once Run has rebuilt the actual state;
	// reconstruction is set before. rebuilt is closed then too, or when
	// the rebuilding failed.
	reconstructed  chan struct{}
	rebuilt        chan struct{}
	reconstruction reconstruct.Result
	// ready is set once reconstruction is done and the desired state
	// synced; synced is closed at the same moment.
	ready  atomic.Bool
	synced chan struct{}
}

// New validates cfg and builds a Manager; Run starts it. ctx carries the
// logger of the parts that log while being built.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	err := cfg.validate()
	layout, layoutErr := paths.New(cfg.RootDir)
	if err := errors.Join(err, layoutErr); err != nil {
		return nil, fmt.Errorf("lifecycle: %w", err)
	}
	m := &Manager{
		cfg:           cfg,
		layout:        layout,
		mounter:       mount.New(""),
		world:         asw.New(asw.Options{}),
		desire:        dsw.New(),
		reconstructed: make(chan struct{}),
		rebuilt:       make(chan struct{}),
		synced:        make(chan struct{}),
	}
	met, err := metrics.New(metrics.Config{Registerer: cfg.Registerer, Volumes: m.volumeCounts})
	if err != nil {
		return nil, err
	}
	ownership, err := metrics.NewOwnership(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m.owner = nodeowner.AlwaysOwned()
	if cfg.Standalone == nil {
		m.owner = nodeowner.New(cfg.NodeName, klog.FromContext(ctx))
	}
	if err := m.owner.Register(cfg.Registerer); err != nil {
		return nil, err
	}
	queues := status.QueueOptions{MetricsProvider: met.WorkqueueProvider()}
	if cfg.Standalone != nil {
		m.mode, err = newStandaloneMode(ctx, m)
	} else {
		m.mode, err = newClusterMode(ctx, m, queues)
	}
	if err != nil {
		return nil, err
	}
	in := m.mode.inputs()
	var seLinux selinux.Translator = selinux.Host{}
	if cfg.SELinux != nil {
		seLinux = cfg.SELinux
	}
	var terminal func(types.UID)
	if cfg.WaitForContainersStopped {
		if m.holds, err = m.newRuntimePods(ctx); err != nil {
			return nil, errors.Join(err, m.mode.close())
		}
		terminal = m.holds.Terminal
	}
	if m.pop, err = populator.New(populator.Config{
		Source: in.source, DesiredState: m.desire, Policies: cfg.Policies,
		NodeName: cfg.NodeName, RemoveTerminatingPods: cfg.RemoveTerminatingPods,
		WaitForContainersStopped: cfg.WaitForContainersStopped,
		Node:                     in.node, SELinux: seLinux,
		SELinuxMountReadWriteOncePodOnly: cfg.SELinuxMountReadWriteOncePodOnly,
		Published:                        publishedIn{world: m.world, whole: m.rebuilt}, Terminal: terminal,
	}); err != nil {
		return nil, errors.Join(err, m.mode.close())
	}
	if m.ops, err = operations.New(operations.Config{
		RootDir: layout.Root(), NodeName: cfg.NodeName,
		Drivers:     operations.ClientLookup(cfg.Drivers.Client),
		Policies:    cfg.Policies,
		Attachments: in.attachments,
		State:       m.world,
		Secrets:     in.secrets,
		Tokens:      in.tokens,
		Mounts:      m.mounter,
		Observer:    met,
		Ownership:   ownership,
		Gate:        m.owner,
		Wanted:      wantedIn{m.desire},
		// The reconciler exists by the time a publish reports progress.
		OnProgress: func(key volume.PodKey) {
			m.rec.StepProgressed(key)
			m.rec.PodStatusChanged(key.Pod)
		},
	}); err != nil {
		return nil, errors.Join(err, m.mode.close())
	}
	rcfg := cfg.Reconciler
	rcfg.Desired, rcfg.Actual = m.desire, m.world
	if rcfg.Operations, err = m.newMountChecker(in, m.mode.steps(m.ops)); err != nil {
		return nil, errors.Join(err, m.mode.close())
	}
	rcfg.Policies, rcfg.Drivers, rcfg.Synced = cfg.Policies, registered{cfg.Drivers}, m.pop.Synced()
	rcfg.Settled = m.pop.Settled
	rcfg.Status, rcfg.Events, rcfg.InUse = observe(in.status, cfg.PodObserver), in.events, in.inUse
	if in.expander != nil {
		rcfg.Expander = in.expander
	}
	if m.stats != nil {
		rcfg.Health = m.stats
	}
	rcfg.Ready = met
	rcfg.Gate = m.owner
	if cfg.Reconciler.Ready != nil {
		rcfg.Ready = readyObservers{met, cfg.Reconciler.Ready}
	}
	rcfg.MetricsProvider = met.WorkqueueProvider()
	if cfg.ResyncPeriod != 0 {
		rcfg.ResyncPeriod = cfg.ResyncPeriod
	}
	if m.holds != nil {
		rcfg.Holds = m.holds
		// Before the reconciler's: a pod's leaving is noted before its
		// teardown is considered.
		m.desire.Subscribe(m.holds.DesiredStateHandler())
	}
	if m.rec, err = reconciler.New(rcfg); err != nil {
		return nil, errors.Join(err, m.mode.close())
	}
	m.desire.Subscribe(m.rec.DesiredStateHandler())
	m.desire.Subscribe(dsw.Handler{PodVolume: m.interruptUnwanted})
	if tokens, ok := in.tokens.(*cachedTokens); ok {
		tokens.forgetLeavingPods(m.desire)
	}
	cfg.Policies.OnChange(m.rec.PolicyChanged)
	cfg.Drivers.OnRegistered(m.rec.DriverRegistered)
	// A driver back after a restart gets its failed steps retried now.
	cfg.Drivers.OnReconnected(m.rec.DriverRegistered)
	return m, nil
}

// Ready reports whether the actual state was reconstructed and the desired
// state has seen every pod: /readyz.
func (m *Manager) Ready() bool { return m.ready.Load() }

// NodeOwner tells whether the agent owns its Node, and wakes those who
// wait for it: nothing is mounted, unmounted or written to the API server
// while it is closed.
func (m *Manager) NodeOwner() *nodeowner.Gate { return m.owner }

// Snapshot returns every volume the agent holds, for the status API.
func (m *Manager) Snapshot() []asw.VolumeStatus { return m.world.Snapshot() }

// Reconstructed is closed once Run has rebuilt the actual state from disk.
func (m *Manager) Reconstructed() <-chan struct{} { return m.reconstructed }

// Reconstruction returns what Run found on disk at start; it is complete
// once Reconstructed is closed.
func (m *Manager) Reconstruction() reconstruct.Result {
	select {
	case <-m.reconstructed:
		return m.reconstruction
	default:
		return reconstruct.Result{}
	}
}

// Operations returns the operations the reconciler runs: the front
// endpoint runs a container orchestrator's steps through them, with the
// same code, locks, actual state and records. Serve them only once
// Reconstructed is closed.
func (m *Manager) Operations() *operations.Operations { return m.ops }

// rebuildActualState is reconstruct.Run; a test holds it to see what runs
// meanwhile.
var rebuildActualState = reconstruct.Run

// Run runs the lifecycle until ctx ends: the mode's sources and the
// populator at once, building the desired state from the API while the
// actual state is rebuilt from disk (a restart with thousands of volumes
// would otherwise read the records and then the objects, one after the
// other); the reconciler, the mode's status writers and the checks of
// what is mounted once the actual state is whole. It never tears anything
// down on its way out. Call it once.
func (m *Manager) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	inputsCtx, stopInputs := context.WithCancel(ctx)
	defer stopInputs()
	var inputs sync.WaitGroup
	inputs.Go(func() { m.mode.runInputs(inputsCtx, m.rec) })
	inputs.Go(func() {
		if err := m.pop.Run(inputsCtx); err != nil && inputsCtx.Err() == nil {
			logger.Error(err, "Populator stopped")
		}
	})
	res, err := rebuildActualState(ctx, m.layout, m.mounter, m.world)
	close(m.rebuilt)
	if err != nil {
		stopInputs()
		inputs.Wait()
		return errors.Join(fmt.Errorf("reconstruct actual state: %w", err), m.mode.close())
	}
	if n := m.mode.migrateRecords(ctx); n > 0 {
		logger.Info("Migrated attachment records", "migrated", n)
		res.Migrated += n
	}
	m.reconstruction = res
	close(m.reconstructed)

	var wg sync.WaitGroup
	wg.Go(func() { m.mode.runOutputs(ctx, m.rec) })
	wg.Go(func() { m.rec.Run(ctx) })
	wg.Go(func() { m.runChanges(ctx) })
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-m.pop.Synced():
			m.ready.Store(true)
			close(m.synced)
			logger.Info("Volume lifecycle ready: actual state reconstructed, desired state synced")
		}
	})
	wg.Wait()
	inputs.Wait()
	return m.mode.close()
}

func (m *Manager) volumeCounts() metrics.VolumeCounts {
	desired := m.desire.Counts().PodVolumesByDriver
	actual := map[string]int{}
	for _, v := range m.world.Snapshot() {
		actual[v.Driver] += max(len(v.Pods), 1)
	}
	return metrics.VolumeCounts{Desired: desired, Actual: actual}
}

// volumeInUse says whether a volume is wanted by a pod or held on the node
// (possibly staged): such a volume must stay attached.
func (m *Manager) volumeInUse(name volume.Name) bool {
	if m.desire.IsVolumeWanted(name) {
		return true
	}
	_, held := m.world.Volume(name)
	return held
}

// interruptUnwanted interrupts the fsGroup ownership change of a pod's
// volume that the pod no longer wants (it was deleted): its unpublish need
// not wait for the walk.
func (m *Manager) interruptUnwanted(key volume.PodKey) {
	if _, wanted := m.desire.PodVolume(key); !wanted {
		m.ops.Interrupt(key)
	}
}

// registered adapts Drivers to the reconciler's.
type registered struct{ drivers Drivers }

func (r registered) Registered(name string) bool {
	_, ok := r.drivers.Client(name)
	return ok
}

// readyObservers tells each of its observers.
type readyObservers []reconciler.ReadyObserver

func (o readyObservers) ObservePodReady(pod volume.PodInfo, firstSeen, ready time.Time) {
	for _, obs := range o {
		obs.ObservePodReady(pod, firstSeen, ready)
	}
}

// publishedIn tells the populator which pod volumes the actual state has
// (published, or uncertain). The populator runs while the actual state is
// being rebuilt from disk: an answer waits until it is whole (or its
// rebuilding failed), so that a running pod's volume is never taken for
// one it was only about to get.
type publishedIn struct {
	world *asw.World
	whole <-chan struct{}
}

// wantedIn is the desired state as operations ask it, under a step's lock,
// whether a stage or publish is still wanted.
type wantedIn struct{ desire *dsw.Store }

func (w wantedIn) VolumeWanted(name volume.Name) bool { return w.desire.IsVolumeWanted(name) }

func (w wantedIn) UseWanted(key volume.PodKey) bool {
	_, ok := w.desire.PodVolume(key)
	return ok
}

func (p publishedIn) Published(key volume.PodKey) bool {
	<-p.whole
	_, ok := p.world.Pod(key)
	return ok
}
