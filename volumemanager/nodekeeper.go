package volumemanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
)

// ControllerManagedAttachAnnotation makes the attach/detach controller
// attach and detach the node's volumes (the kubelet sets it when it
// registers).
const ControllerManagedAttachAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"

// The Ready condition the agent posts for a node it registers.
const (
	NodeReadyReason  = "CSIVolmgrReady"
	NodeReadyMessage = "csi-volmgr is posting ready status (volumes only: this node runs no containers)"
	// NodeDriversNotRegisteredReason: the Ready condition is False, for a
	// node the agent registers as that Node (NodeIdentity), while one of
	// Config.ExpectedDrivers has not registered; the message names them.
	NodeDriversNotRegisteredReason = "CSIVolmgrDriversNotRegistered"
)

// The node keeper's defaults: the kubelet's 40s Lease (renewed every
// quarter of it) and virtual-kubelet's one-minute status update.
const (
	defaultNodeLeaseDuration  = 40 * time.Second
	defaultNodeStatusInterval = time.Minute
	// nodeWatchSyncTimeout bounds one registration's wait for the keeper's
	// watch of the Node to list it; Register tries again after it.
	nodeWatchSyncTimeout = 10 * time.Second
)

// errForeignNode is why the keeper leaves an existing Node alone.
var errForeignNode = errors.New("the Node exists without the label " + OwnerLabel + "=" + OwnerLabelValue +
	"; another volume manager (a kubelet) may own it, and the keeper labels only a Node it creates")

// errTaintLeftBehind is why a Node kept as that Node (NodeIdentity) may
// carry TaintDriversNotReady for good.
var errTaintLeftBehind = errors.New("the Node carries the taint " + TaintDriversNotReady + " from a run without --node-identity; " +
	"acting as its Node the agent may not remove it (NodeRestriction) and reports missing drivers by the Ready condition: " +
	"remove it with kubectl taint node <node> " + TaintDriversNotReady + "-")

// nodeKeeper registers and keeps the Node of a node that has neither a
// kubelet nor a runtime (Config.RegisterNode) with virtual-kubelet's
// NodeController: it creates the Node (labels OwnerLabel,
// kubernetes.io/hostname, os and arch, the attach/detach annotation,
// Ready=True) or brings an existing one in line, renews the node Lease
// kube-node-lease/<node> under a holder identity of its own
// (nodekeeper_lease.go), and posts the Node's status every status interval
// with a three-way patch that touches only what it posted, so
// status.volumesInUse is left to the volume manager. A Ready condition
// someone else turned, a removed annotation, a removed label of NodeLabels
// or a changed capacity is put back at the next status update. The Node's
// shape is the Config's: NodeCapacity as capacity and allocatable (without
// "pods" no scheduler places pods here, and pods reach the node only by
// spec.nodeName), NodeLabels besides the keeper's own, and NodeTaints at
// registration (added to a kept Node that lacks them, unless NodeRestriction
// forbids it, as it forbids a node to change its taints). Nothing else of a
// kubelet's status is faked.
//
// Ownership is held at write time (nodekeeper_owner.go). The keeper watches
// its Node and tells the owner Gate of every version, UID included: the
// Node it creates, or first finds with OwnerLabel, is pinned by UID, and a
// Node of the same name with another UID is another Node (the Gate closes,
// Event EventNodeReplaced). Every write of the keeper — the Node's
// creation, its status patches, its Lease — is checked against the latest
// version first, and a status patch carries that version's UID and
// resourceVersion, so that it applies to nothing else:
//
//   - it writes only while the Node carries OwnerLabel and is the pinned
//     one, and only while it holds the Node's Lease;
//   - it never puts OwnerLabel back: a Node without it is written no more
//     (an operator's removal stays, and the agent stops new work), and the
//     label is set only on a Node the keeper creates;
//   - it creates the Node again when the pinned Node is deleted while the
//     agent served it (the label on its last version), with an error line
//     and EventNodeRecreated on the new Node, and serves the new Node: it
//     created it itself. A Node whose label was removed before it was
//     deleted is not created again;
//   - another agent that renews the Node's Lease (a second host with the
//     same --node-name, e.g. a cloned image) makes it act on nothing until
//     restarted: one error line naming the other holder,
//     EventNodeLeaseHeldByAnother on the Node, /readyz fails.
//
// It never takes over another volume manager's Node (fail closed): an
// existing Node is kept only when it carries OwnerLabel=OwnerLabelValue.
// Any other existing Node — a kubelet's — is not touched: the keeper logs
// one error naming it and the label, and tries again only when the Node
// changes as the owner Gate sees it (labelled, or deleted).
type nodeKeeper struct {
	client         kubernetes.Interface
	name           string
	leaseDuration  time.Duration
	statusInterval time.Duration
	// retryBase and retryMax bound the backoff of Register.
	retryBase, retryMax time.Duration

	// capacity, labels and taints shape the Node (Config.NodeCapacity,
	// NodeLabels, NodeTaints); set by shape before Register.
	capacity corev1.ResourceList
	labels   map[string]string
	taints   []corev1.Taint

	// drivers keeps TaintDriversNotReady, or under NodeIdentity the Ready
	// condition False, while expected drivers are missing; nil without
	// expected drivers.
	drivers *expectedDrivers

	// owner is the agent's owner Gate, fed by the keeper's watch of the
	// Node (UIDs included); it wakes a keeper that found a Node it does not
	// keep. Register makes one when the wiring set none (tests of the
	// keeper alone).
	owner *nodeowner.Gate
	// idle is set when Register left the Node alone (not labelled, not the
	// pinned one, or not to be created again): Run registers again at the
	// Gate's next change.
	idle bool

	// identity is the holder identity the keeper writes into the Node's
	// Lease: holderIdentity(), unless a test sets another.
	identity string
	// lease renews the Lease; own holds what the keeper checks before its
	// writes (nodekeeper_owner.go).
	lease *nodeLease
	own   keeperOwnership

	// nc is the running node controller; stop ends it.
	nc   *node.NodeController
	stop context.CancelFunc

	// first is the progress of the first Register, for /readyz.
	first firstRegistration
}

// firstRegistration is what /readyz tells of the first Register while it
// retries (e.g. through an API server outage at start).
type firstRegistration struct {
	// mu protects the fields below.
	mu sync.Mutex
	// done is set when the first Register returned.
	done bool
	// lastErr is the error of its last failed try.
	lastErr error
}

func (r *firstRegistration) failed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastErr = err
}

func (r *firstRegistration) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done, r.lastErr = true, nil
}

// Registering tells whether the first Register has not returned yet and,
// while it has not, why the Node is not registered.
func (k *nodeKeeper) Registering() (bool, string) {
	k.first.mu.Lock()
	defer k.first.mu.Unlock()
	if k.first.done {
		return false, ""
	}
	if k.first.lastErr == nil {
		return true, fmt.Sprintf("node %s not registered yet: registering it (--register-node)", k.name)
	}
	return true, fmt.Sprintf("node %s not registered yet (--register-node), will retry: %v", k.name, k.first.lastErr)
}

func newNodeKeeper(client kubernetes.Interface, name string, leaseDuration, statusInterval time.Duration) *nodeKeeper {
	if leaseDuration == 0 {
		leaseDuration = defaultNodeLeaseDuration
	}
	if statusInterval == 0 {
		statusInterval = defaultNodeStatusInterval
	}
	return &nodeKeeper{client: client, name: name, leaseDuration: leaseDuration, statusInterval: statusInterval,
		retryBase: 500 * time.Millisecond, retryMax: 30 * time.Second, identity: holderIdentity()}
}

// shape sets the Node's capacity (and allocatable), extra labels and
// taints (Config.NodeCapacity, NodeLabels, NodeTaints, validated).
func (k *nodeKeeper) shape(capacity corev1.ResourceList, labels map[string]string, taints []corev1.Taint) {
	k.capacity, k.labels, k.taints = capacity.DeepCopy(), maps.Clone(labels), slices.Clone(taints)
}

// spec is the Node the keeper posts.
func (k *nodeKeeper) spec() *corev1.Node {
	ready, _, _ := k.readyCondition(metav1.Now())
	labels := maps.Clone(k.labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, ownLabels(k.name))
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        k.name,
			Labels:      labels,
			Annotations: map[string]string{ControllerManagedAttachAnnotation: "true"},
		},
		Spec: corev1.NodeSpec{Taints: append(k.drivers.initial(), k.taints...)},
		Status: corev1.NodeStatus{
			Capacity: k.capacity.DeepCopy(), Allocatable: k.capacity.DeepCopy(),
			Conditions: []corev1.NodeCondition{ready},
		},
	}
}

// addMissingTaints adds to an existing Node the configured taints it
// lacks (a key with the same effect counts as present, whatever its
// value: someone changed it on purpose). spec.taints is replaced whole, so
// the patch carries the Node's resourceVersion: a concurrent change fails
// it with Conflict and Register tries again.
func (k *nodeKeeper) addMissingTaints(ctx context.Context, existing *corev1.Node) error {
	taints := slices.Clone(existing.Spec.Taints)
	var added []string
	for _, want := range k.taints {
		if !slices.ContainsFunc(taints, func(t corev1.Taint) bool { return t.MatchTaint(&want) }) {
			taints = append(taints, want)
			added = append(added, want.ToString())
		}
	}
	if len(added) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": existing.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
	if err != nil {
		return fmt.Errorf("encoding the taints patch: %w", err)
	}
	if _, err := k.client.CoreV1().Nodes().Patch(ctx, k.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("adding taints to Node %s: %w", k.name, err)
	}
	klog.FromContext(ctx).Info("Added the configured taints to the existing Node", "node", k.name, "taints", added)
	return nil
}

// Register starts the node controller and returns once the Node is
// registered. It retries with backoff until ctx ends, except when the API
// refuses for good (Forbidden, Unauthorized, Invalid). The controller runs
// until ctx ends or Run returns; the keeper's watch of the Node, started by
// the first Register, until ctx ends. When the Node exists and is not the
// keeper's to keep (see nodeKeeper), Register logs it once and returns nil
// without a controller: Run then waits for the Node to change. When
// another agent holds the Node's Lease, Register waits until it is
// renewed (that agent serves the Node: Register logs it, holds the Gate
// closed for good and returns nil) or expires (Register takes it over).
//
// Until the first Register returns, Registering says it is in progress,
// with the error of its last try.
func (k *nodeKeeper) Register(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer k.first.finish()
	if err := k.watch(ctx); err != nil {
		return fmt.Errorf("registering Node %s: %w", k.name, err)
	}
	// Not wait.ExponentialBackoff: a Backoff whose delay reaches its Cap
	// ends its steps, and the agent would give up after half a minute of an
	// API server outage (a chaos run's finding).
	delay := k.retryBase
	for {
		err := k.start(ctx)
		var held *leaseHeldError
		switch {
		case err == nil:
			k.idle = false
			logger.Info("Node registered", "node", k.name, "uid", k.owner.Pinned(), "holderIdentity", k.identity)
			return nil
		case errors.Is(err, errForeignNode), errors.Is(err, errNotRecreating), errors.Is(err, nodeowner.ErrNotOwned):
			if !k.idle {
				logger.Error(err, "Not registering the Node: the agent acts on nothing until the Node changes",
					"node", k.name, "label", OwnerLabel+"="+OwnerLabelValue)
			}
			k.idle = true
			return nil
		case errors.As(err, &held):
			k.idle = false
			k.contested(ctx, held.holder)
			return nil
		case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsInvalid(err):
			return fmt.Errorf("registering Node %s: %w", k.name, err)
		}
		k.first.failed(err)
		logger.Error(err, "Registering the Node failed; will retry", "node", k.name, "delay", delay)
		select {
		case <-ctx.Done():
			return fmt.Errorf("registering Node %s: %w", k.name, errors.Join(ctx.Err(), err))
		case <-time.After(wait.Jitter(delay, 0.1)):
		}
		delay = min(2*delay, k.retryMax)
	}
}

// start runs a node controller and waits until it registered the Node;
// errForeignNode when the Node exists and is not the keeper's to keep, an
// error wrapping nodeowner.ErrNotOwned when it is not the pinned one,
// errNotRecreating when it is gone and not to be created again, a
// *leaseHeldError when another agent renews its Lease.
func (k *nodeKeeper) start(ctx context.Context) error {
	nodes := k.client.CoreV1().Nodes()
	existing, err := nodes.Get(ctx, k.name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err == nil {
		k.drivers.seedReady(existing)
	}
	spec := k.spec()
	// The Gate follows the keeper's watch (UIDs) before anything is
	// written.
	syncCtx, cancel := context.WithTimeout(ctx, nodeWatchSyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), k.own.synced) {
		return errors.Join(ctx.Err(), errors.New("the watch of the Node has not listed it yet"))
	}
	switch {
	case apierrors.IsNotFound(err):
		existing = nil
		if err := k.mayCreate(); err != nil {
			return err
		}
	case !keepable(existing):
		return errForeignNode
	default:
		// The first Node seen with the label is the one the agent serves.
		if err := k.adopt(existing); err != nil {
			return err
		}
	}
	// The Lease first: no write to the Node while another agent serves it.
	if err := k.acquireLease(ctx, existing); err != nil {
		return err
	}
	if existing != nil && k.drivers != nil && k.drivers.asNode &&
		slices.ContainsFunc(existing.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintDriversNotReady }) {
		// Left by a run without NodeIdentity: the Node may not remove it.
		klog.FromContext(ctx).Error(errTaintLeftBehind, "The Node keeps pods off until the taint is removed by hand",
			"node", k.name, "taint", TaintDriversNotReady)
	}
	if existing != nil {
		switch err := k.addMissingTaints(ctx, existing); {
		case apierrors.IsForbidden(err):
			// NodeRestriction lets a node set its taints only when it
			// creates itself, and the kubelet too adds none to an existing
			// Node: keep it as it is.
			klog.FromContext(ctx).Error(err, "Cannot add the configured taints to the existing Node; keeping it without them", "node", k.name)
		case err != nil:
			return err
		}
	}
	gated := &ownedNodes{NodeInterface: nodes, k: k}
	// The keeper renews the Lease itself (its holder identity): without
	// virtual-kubelet's lease controller the controller posts the status
	// every ping interval.
	nc, err := node.NewNodeController(driversProvider{k}, spec, gated,
		node.WithNodePingInterval(k.statusInterval),
		node.WithNodeStatusUpdateInterval(k.statusInterval),
		node.WithNodeStatusUpdateErrorHandler(func(ctx context.Context, err error) error {
			if !apierrors.IsNotFound(err) {
				return err
			}
			if _, err := gated.Create(ctx, k.spec(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			return nil
		}))
	if err != nil {
		return err
	}
	ncCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	go func() { _ = nc.Run(ncCtx) }()
	select {
	case <-nc.Ready():
		leaseDone := make(chan struct{})
		go func() { defer close(leaseDone); k.renewLease(ncCtx) }()
		k.nc, k.stop = nc, func() { stop(); <-leaseDone }
		return nil
	case <-nc.Done():
		stop()
		return nc.Err()
	case <-ctx.Done():
		stop()
		<-nc.Done()
		return ctx.Err()
	}
}

// keepable tells whether the keeper may keep an existing Node: it carries
// OwnerLabel. The keeper sets the label only on a Node it creates; a Node
// without it — a kubelet's, or one whose label an operator removed — is
// never labelled by the keeper.
func keepable(n *corev1.Node) bool { return nodeowner.HasLabel(n.Labels) }

// Run keeps the Node until ctx ends; the Node and its Lease are left in
// place, as a kubelet leaves them. Call it after a successful Register.
// After a Register that left the Node alone, it registers again at each
// change of the owner Gate (the Node labelled, or deleted) until it
// succeeds or ctx ends; after one that found another agent serving the
// Node, it returns at once.
func (k *nodeKeeper) Run(ctx context.Context) {
	var changed <-chan struct{}
	if k.owner != nil {
		changed = k.owner.Changed()
	}
	for first := true; k.nc == nil; first = false {
		if !k.idle || k.owner == nil {
			return
		}
		// A label set since Register looked is not missed: the first
		// round does not wait when the Gate is open already, and each
		// later one waits on the Gate's state from before its Register.
		if owned, _ := k.owner.Owned(); !first || !owned {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
		changed = k.owner.Changed()
		if err := k.Register(ctx); err != nil {
			if ctx.Err() == nil {
				klog.FromContext(ctx).Error(err, "Registering the Node failed", "node", k.name)
			}
			return
		}
	}
	taintCtx, stopTaint := context.WithCancel(ctx)
	taintDone := make(chan struct{})
	go func() { defer close(taintDone); k.runDrivers(taintCtx) }()
	defer func() { stopTaint(); <-taintDone }()
	select {
	case <-ctx.Done():
	case <-k.nc.Done():
		if err := k.nc.Err(); err != nil && !errors.Is(err, context.Canceled) {
			klog.FromContext(ctx).Error(err, "The node controller stopped", "node", k.name)
		}
	}
	k.stop()
	<-k.nc.Done()
}
