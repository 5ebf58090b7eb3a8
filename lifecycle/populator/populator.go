package populator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/selinux"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// defaultWorkers is the number of pods resolved in parallel. Resolving
// reads caches only, so a few workers keep up with any pod churn.
const defaultWorkers = 2

// Config configures a Populator.
type Config struct {
	// Source serves the pods and the objects they reference. Required.
	Source Source
	// DesiredState receives the result. Required.
	DesiredState DesiredState
	// Policies tells which lifecycle modes each driver supports and whether
	// its volumes need a VolumeAttachment. Required.
	Policies DriverPolicies
	// NodeName names this node, for the VolumeAttachment names. Required.
	NodeName string
	// RemoveTerminatingPods removes a pod from the desired state as soon as
	// it is marked for deletion (deletionTimestamp set), instead of when it
	// is deleted or terminal. For nodes without a kubelet, where nobody
	// stops the pod's containers before it is deleted.
	RemoveTerminatingPods bool
	// WaitForContainersStopped is set when a runtime runs the pods'
	// containers and says when they stopped (ContainersStopped): a pod
	// leaves the desired state on that signal, when it is terminal or when
	// it is gone, never because it is marked for deletion.
	WaitForContainersStopped bool
	// Terminal, when set, is told of every pod that leaves the desired
	// state because the API server shows it in a terminal phase: its
	// containers are done (runtimepods.Pods.Terminal). A pod that leaves
	// because it is gone is not: only its runtime may say its containers
	// stopped.
	Terminal func(uid types.UID)
	// Workers is the number of pods resolved in parallel; 0 means 2.
	Workers int
	// Clock stamps when pods are first seen; nil means the real clock.
	Clock clock.PassiveClock
	// Node gives this node's labels, against which PersistentVolumes'
	// nodeAffinity is checked; nil checks nothing (standalone mode).
	Node NodeLabels
	// SELinux turns the pods' SELinux options into the context their PVs
	// are mounted with; nil mounts without one, as on a host without
	// SELinux.
	SELinux selinux.Translator
	// SELinuxMountReadWriteOncePodOnly, when set and true, mounts only
	// PVs whose one access mode is ReadWriteOncePod with an SELinux
	// context, as the kubelet before 1.37 does (SELinuxMount off, only
	// SELinuxMountReadWriteOncePod); nil or false mounts PVs of every
	// access mode with one (SELinuxMount, GA in 1.37). It is asked at each
	// resolution: the agent sets it from the API server's version before
	// the first.
	SELinuxMountReadWriteOncePodOnly func() bool
	// Published tells which of the pods' volumes are published (or may
	// be): a pod whose volume now resolves to another volume keeps the one
	// it has only if it is published; one it was only about to get is
	// replaced. nil treats every resolved volume as published, as the
	// kubelet, which resolves a pod once.
	Published PublishedVolumes
}

// PublishedVolumes is what the populator asks of the actual state.
type PublishedVolumes interface {
	// Published says whether the pod's volume is published, or may be.
	Published(key volume.PodKey) bool
}

// Validate checks the required fields.
func (c Config) Validate() error {
	var errs []error
	if c.Source == nil {
		errs = append(errs, errors.New("populator: Source is required"))
	}
	if c.DesiredState == nil {
		errs = append(errs, errors.New("populator: DesiredState is required"))
	}
	if c.Policies == nil {
		errs = append(errs, errors.New("populator: Policies is required"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("populator: NodeName is required"))
	}
	if c.Workers < 0 {
		errs = append(errs, fmt.Errorf("populator: Workers must not be negative, got %d", c.Workers))
	}
	return errors.Join(errs...)
}

// Populator keeps the desired state of world in line with the node's pods.
// Every pod event, change of a referenced object and driver policy change
// enqueues the pods concerned; a worker resolves a pod from the caches and
// replaces its desired state in one SetPod.
type Populator struct {
	cfg   Config
	clock clock.PassiveClock
	queue workqueue.TypedRateLimitingInterface[types.UID]

	// mu protects firstSeen, seen, initial, isSynced, unresolved and
	// events.
	mu sync.Mutex
	// unresolved holds, for each pod with an event not yet resolved into
	// the desired state (queued, being resolved, or waiting for the objects
	// it references), the number of its latest event; events counts them.
	unresolved map[types.UID]uint64
	events     uint64
	// seen holds the pods whose events have reached the populator, until
	// the Source no longer has them. A pod in the Source's cache that is
	// not in it has an event on its way (an informer updates its cache
	// before it tells its handlers: a relist after an API server outage
	// replaces the whole cache, then reports deletions first).
	seen map[types.UID]struct{}
	// firstSeen is when each pod's first event arrived; kept until the pod
	// leaves.
	firstSeen map[types.UID]time.Time
	// initial are the pods known when the sources synced that have not
	// been resolved yet; nil until the sources synced.
	initial  map[types.UID]struct{}
	isSynced bool
	synced   chan struct{}

	stops stopSignals
}

// New returns a Populator for cfg and subscribes it to the Source's and the
// policies' events; nothing is processed until Run.
func New(cfg Config) (*Populator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Workers == 0 {
		cfg.Workers = defaultWorkers
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	p := &Populator{
		cfg:   cfg,
		clock: clk,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.UID](),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "populator"}),
		firstSeen:  make(map[types.UID]time.Time),
		unresolved: make(map[types.UID]uint64),
		seen:       make(map[types.UID]struct{}),
		synced:     make(chan struct{}),
	}
	cfg.Source.OnPodChange(p.podChanged)
	cfg.Policies.OnChange(p.driverChanged)
	if cfg.Node != nil {
		cfg.Node.OnChange(func() { p.driverChanged("") })
	}
	return p, nil
}

// Run waits for the Source and the policies to sync, resolves every pod once
// and then every pod that an event concerns, until ctx ends. It returns
// after its workers have stopped; the error is non-nil only if ctx ended
// before the caches synced.
func (p *Populator) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer p.queue.ShutDown()
	logger := klog.FromContext(ctx).WithName("populator")
	ctx = klog.NewContext(ctx, logger)

	logger.V(2).Info("Waiting for sources to sync")
	synced := []cache.InformerSynced{p.cfg.Source.HasSynced, p.cfg.Policies.HasSynced}
	if p.cfg.Node != nil {
		synced = append(synced, p.cfg.Node.HasSynced)
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return fmt.Errorf("populator: caches did not sync: %w", context.Cause(ctx))
	}
	pods := p.cfg.Source.Pods()
	p.mu.Lock()
	p.initial = make(map[types.UID]struct{}, len(pods))
	for _, pod := range pods {
		p.initial[pod.UID] = struct{}{}
	}
	p.checkSyncedLocked(logger)
	p.mu.Unlock()
	for _, pod := range pods {
		p.podChanged(pod.UID)
	}
	logger.V(2).Info("Starting workers", "workers", p.cfg.Workers, "pods", len(pods))

	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, p.runWorker, time.Second) })
	}
	<-ctx.Done()
	p.queue.ShutDown()
	wg.Wait()
	logger.V(2).Info("Stopped")
	return nil
}

// HasSynced tells whether the desired state is complete: the sources have
// synced and every pod known then has been resolved once. Nothing may be
// torn down before, since a pod not yet resolved looks like a pod that
// wants nothing.
func (p *Populator) HasSynced() bool {
	select {
	case <-p.synced:
		return true
	default:
		return false
	}
}

// Synced returns a channel closed when HasSynced becomes true.
func (p *Populator) Synced() <-chan struct{} { return p.synced }

// Settled tells whether every pod event so far has been resolved into the
// desired state. While it is false, a pod the desired state does not show
// yet (one just created, or waiting for its claim to be cached) may want any
// volume, so a volume that looks unwanted must not be unstaged: the
// reconciler waits.
//
// It is also false while the Source has a pod whose event has not reached
// the populator yet (after a relist, the deletion of an old pod of a volume
// and the creation of a new one arrive one after the other, and between
// the two the volume would look unwanted), and while the Source's pod cache
// lacks a pod the API server has (a broken watch). That last check asks the
// API server, so Settled is for decisions that are rare and must be right:
// the reconciler asks it right before it unstages a volume.
func (p *Populator) Settled() bool {
	p.mu.Lock()
	unresolved := len(p.unresolved)
	p.mu.Unlock()
	if unresolved > 0 {
		return false
	}
	if c, ok := p.cfg.Source.(currentPods); ok && !c.PodsCurrent(context.Background()) {
		return false
	}
	pods := p.cfg.Source.Pods()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range pods {
		if _, ok := p.seen[pod.UID]; !ok {
			return false
		}
	}
	return len(p.unresolved) == 0
}

// currentPods is implemented by a Source whose pod cache can fall behind
// the API server (*source.Source: a broken watch).
type currentPods interface {
	// PodsCurrent tells whether the cache has every pod of the node, as
	// the API server says now.
	PodsCurrent(ctx context.Context) bool
}

// podChanged enqueues a pod and notes when it was first seen.
func (p *Populator) podChanged(uid types.UID) {
	p.mu.Lock()
	if _, ok := p.firstSeen[uid]; !ok {
		p.firstSeen[uid] = p.clock.Now()
	}
	p.events++
	p.unresolved[uid] = p.events
	p.seen[uid] = struct{}{}
	p.mu.Unlock()
	p.queue.Add(uid)
}

// latestEvent returns the number of the pod's latest unresolved event.
func (p *Populator) latestEvent(uid types.UID) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unresolved[uid]
}

// settle records that the pod's events up to event are resolved; a newer
// event keeps it unresolved until that one is.
func (p *Populator) settle(uid types.UID, event uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unresolved[uid] == event {
		delete(p.unresolved, uid)
	}
}

// driverChanged re-resolves every pod when a driver's policy (or the node's
// labels) changes; such changes are rare and resolving is cheap.
func (p *Populator) driverChanged(string) {
	for _, pod := range p.cfg.Source.Pods() {
		p.queue.Add(pod.UID)
	}
}

func (p *Populator) runWorker(ctx context.Context) {
	for p.processNext(ctx) {
	}
}

func (p *Populator) processNext(ctx context.Context) bool {
	uid, shutdown := p.queue.Get()
	if shutdown {
		return false
	}
	defer p.queue.Done(uid)
	if err := p.syncPod(ctx, uid); err != nil {
		klog.FromContext(ctx).Error(err, "Failed to resolve pod volumes, will retry", "podUID", uid)
		p.queue.AddRateLimited(uid)
		return true
	}
	p.queue.Forget(uid)
	return true
}

// syncPod brings one pod's desired state up to date. A nil error with
// nothing written means the pod waits for a cache to sync; the Source
// enqueues it again then. An error after the pod was resolved means an
// object it references cannot be read: it is resolved again with backoff.
func (p *Populator) syncPod(ctx context.Context, uid types.UID) error {
	logger := klog.FromContext(ctx)
	event := p.latestEvent(uid)
	pod, ok := p.cfg.Source.Pod(uid)
	if !ok {
		p.forgetSignal(uid)
		p.mu.Lock()
		delete(p.seen, uid)
		p.mu.Unlock()
	}
	if !ok || p.leaving(pod) {
		if ok && terminal(pod) && p.cfg.Terminal != nil {
			p.cfg.Terminal(uid)
		}
		p.cfg.DesiredState.DeletePod(uid)
		p.cfg.Source.SetReferences(uid, source.References{})
		p.mu.Lock()
		delete(p.firstSeen, uid)
		p.mu.Unlock()
		logger.V(4).Info("Pod left the desired state", "podUID", uid, "exists", ok)
		p.resolved(logger, uid)
		p.settle(uid, event)
		return nil
	}
	logger = klog.LoggerWithValues(logger, "pod", klog.KObj(pod), "podUID", uid)
	if p.terminating(pod) {
		// As the kubelet's findAndAddNewPods, which skips pods whose
		// containers are terminating: a pod marked for deletion gets no
		// volume it does not have yet, and keeps those it has until it is
		// deleted or terminal.
		logger.V(4).Info("Pod is marked for deletion; its desired volumes are kept as they are")
		p.resolved(logger, uid)
		p.settle(uid, event)
		return nil
	}

	var previous []dsw.Use
	if cur, ok := p.cfg.DesiredState.Pod(uid); ok {
		previous = cur.Uses
	}
	r := p.newResolver(logger, pod, previous)
	res := r.resolve()
	if res.pending {
		logger.V(4).Info("Waiting for referenced objects to be cached")
		return nil
	}
	// References first: the reconciler may act on the new desired state at
	// once, and the VolumeAttachments it waits for must be watched by then.
	p.cfg.Source.SetReferences(uid, res.refs)
	p.cfg.DesiredState.SetPod(dsw.Pod{
		Info:      r.info,
		FirstSeen: p.firstSeenOf(uid),
		Uses:      res.uses,
		Errors:    res.errs,
	})
	logger.V(4).Info("Resolved pod volumes", "volumes", len(res.uses), "errors", len(res.errs))
	p.resolved(logger, uid)
	p.settle(uid, event)
	if res.unreadable != nil {
		// Resolved, so that nothing else waits for the pod: the desired
		// state counts as populated and settled, as the kubelet's after
		// one pass whatever single pods do. Read again with backoff.
		return res.unreadable
	}
	return nil
}

// leaving tells whether the pod no longer wants its volumes: it is terminal,
// its runtime said its containers stopped, or (RemoveTerminatingPods,
// without a runtime that signals) it is marked for deletion.
func (p *Populator) leaving(pod *corev1.Pod) bool {
	if terminal(pod) {
		return true
	}
	if leaves, decided := p.runtimeSignal(pod.UID); decided {
		return leaves
	}
	return p.cfg.RemoveTerminatingPods && pod.DeletionTimestamp != nil
}

// terminal tells whether the pod's phase is Succeeded or Failed.
func terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// terminating tells whether the pod is marked for deletion and was not
// known when the sources synced. Pods known then are resolved once whatever
// their state, as the kubelet adds the volumes of terminating pods on its
// first pass after a restart: their containers may still run.
func (p *Populator) terminating(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, initial := p.initial[pod.UID]
	return !initial
}

func (p *Populator) firstSeenOf(uid types.UID) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.firstSeen[uid]; ok {
		return t
	}
	now := p.clock.Now()
	p.firstSeen[uid] = now
	return now
}

// resolved records that a pod known at sync time has been resolved once.
func (p *Populator) resolved(logger klog.Logger, uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.initial == nil {
		return
	}
	delete(p.initial, uid)
	p.checkSyncedLocked(logger)
}

func (p *Populator) checkSyncedLocked(logger klog.Logger) {
	if p.isSynced || len(p.initial) > 0 {
		return
	}
	p.isSynced = true
	close(p.synced)
	logger.V(2).Info("Desired state of world populated")
}
