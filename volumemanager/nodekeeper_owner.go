package volumemanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// The Events of the node keeper, all Warning and on a Node.
const (
	// EventNodeReplaced: a Node of the agent's Node's name exists with
	// another UID than the one the agent served, and someone else created
	// it; the agent acts on nothing (on the new Node).
	EventNodeReplaced = "NodeReplaced"
	// EventNodeRecreated: the Node the agent served was deleted and the
	// node keeper created it again; the agent serves the new Node (on the
	// new Node).
	EventNodeRecreated = "NodeRecreated"
	// EventNodeLeaseHeldByAnother: another agent (named by its holder
	// identity) renews the Node's Lease; this one acts on nothing until
	// restarted (on the Node).
	EventNodeLeaseHeldByAnother = "NodeLeaseHeldByAnother"
)

// errNotRecreating is why the keeper does not create its Node again.
var errNotRecreating = errors.New("the Node the agent served was deleted after its label " + OwnerLabel + "=" + OwnerLabelValue +
	" was removed; the keeper does not create it again (restart the agent to register it)")

// keeperOwnership is what the keeper knows of its Node, from its own
// watch: the owner Gate's view with UIDs.
type keeperOwnership struct {
	// once starts the watch; synced tells when it has listed.
	once   sync.Once
	synced cache.InformerSynced
	store  cache.Store

	// mu serializes the keeper's creation of the Node with the watch's
	// telling the Gate of a version, so that the Node the keeper creates
	// is pinned before the Gate sees it. It protects the fields below.
	mu sync.Mutex
	// latest is the Node's latest version seen; nil while it does not
	// exist.
	latest *corev1.Node
	// servedLabelled tells whether the pinned Node's last version seen
	// carried the label: whether the keeper may create the Node again when
	// it is gone.
	servedLabelled bool
	// reported is the UID of the last replacing Node an Event was written
	// for.
	reported types.UID
	// contested is set for good once another agent was seen renewing the
	// Lease.
	contested bool
	// toldNotRecreating is set once createNode logged errNotRecreating.
	toldNotRecreating bool
}

// watch starts, once, the keeper's watch of its Node (until ctx ends),
// which tells the owner Gate of every version with its UID.
func (k *nodeKeeper) watch(ctx context.Context) error {
	var err error
	k.own.once.Do(func() {
		if k.owner == nil {
			k.owner = nodeowner.New(k.name, klog.FromContext(ctx))
		}
		factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", k.name).String()
			}))
		informer := factory.Core().V1().Nodes().Informer()
		// Each event reads the cache, as the lifecycle's observeOwner does:
		// under own.mu the Gate is never told an older version after a
		// newer one.
		observe := func() { k.observe(ctx) }
		if _, err = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { observe() },
			UpdateFunc: func(any, any) { observe() },
			DeleteFunc: func(any) { observe() },
		}); err != nil {
			return
		}
		k.own.synced, k.own.store = informer.HasSynced, informer.GetStore()
		factory.Start(ctx.Done())
		go func() {
			// A Node that does not exist has no event: the first list tells.
			if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
				observe()
			}
			<-ctx.Done()
			factory.Shutdown()
		}()
	})
	return err
}

// observe tells the Gate of the Node as cached now, and writes
// EventNodeReplaced for a Node of another UID than the pinned one.
func (k *nodeKeeper) observe(ctx context.Context) {
	k.own.mu.Lock()
	var node *corev1.Node
	if obj, exists, err := k.own.store.GetByKey(k.name); err == nil && exists {
		node, _ = obj.(*corev1.Node)
	}
	k.own.latest = node
	if node == nil {
		k.owner.ObserveNode("", nil, false)
		k.own.mu.Unlock()
		return
	}
	k.owner.ObserveNode(node.UID, node.Labels, true)
	pin := k.owner.Pinned()
	var replacedBy *corev1.Node
	switch {
	case node.UID == pin:
		k.own.servedLabelled = nodeowner.HasLabel(node.Labels)
	case pin != "" && k.own.reported != node.UID:
		k.own.reported, replacedBy = node.UID, node
	}
	k.own.mu.Unlock()
	if replacedBy != nil {
		// The Gate logged the one error line.
		k.event(ctx, replacedBy.UID, EventNodeReplaced, fmt.Sprintf(
			"Node %s (UID %s) is not the Node csi-volmgr %s served (UID %s): someone else created it. csi-volmgr acts on nothing here "+
				"(what it mounted stays mounted) until it is restarted, or this Node is deleted and csi-volmgr creates its own",
			k.name, replacedBy.UID, k.identity, pin))
	}
}

// adopt pins existing, a Node with the label, when no Node is pinned yet;
// an error wrapping nodeowner.ErrNotOwned when another one is.
func (k *nodeKeeper) adopt(existing *corev1.Node) error {
	k.own.mu.Lock()
	defer k.own.mu.Unlock()
	if k.owner.Pinned() == "" {
		k.owner.Pin(existing.UID)
		k.own.servedLabelled = true
	}
	return k.owner.Check(existing.UID, existing.Labels)
}

// mayCreate tells whether the keeper may create its Node now that it does
// not exist: when none was pinned yet, or when the pinned one carried the
// label when it went.
func (k *nodeKeeper) mayCreate() error {
	k.own.mu.Lock()
	defer k.own.mu.Unlock()
	return k.mayCreateLocked()
}

func (k *nodeKeeper) mayCreateLocked() error {
	if k.owner.Pinned() != "" && !k.own.servedLabelled {
		return errNotRecreating
	}
	return nil
}

// createNode creates the Node, the keeper's only way to: it checks that it
// may, pins the Node it created, and says so when it replaces a Node the
// agent served (an error line, EventNodeRecreated on the new Node).
func (k *nodeKeeper) createNode(ctx context.Context, nodes typedcorev1.NodeInterface, spec *corev1.Node, opts metav1.CreateOptions) (*corev1.Node, error) {
	k.own.mu.Lock()
	if err := k.writeErrLocked(); err != nil {
		k.own.mu.Unlock()
		return nil, err
	}
	if err := k.mayCreateLocked(); err != nil {
		told := k.own.toldNotRecreating
		k.own.toldNotRecreating = true
		k.own.mu.Unlock()
		if !told {
			klog.FromContext(ctx).Info("Not creating the Node again: its label was removed before it was deleted", "node", k.name,
				"label", OwnerLabel+"="+OwnerLabelValue)
		}
		return nil, err
	}
	prev := k.owner.Pinned()
	created, err := nodes.Create(ctx, spec, opts)
	if err != nil {
		k.own.mu.Unlock()
		return nil, err
	}
	k.owner.Pin(created.UID)
	k.own.servedLabelled = true
	k.own.mu.Unlock()
	if prev == "" {
		klog.FromContext(ctx).Info("Created the Node", "node", k.name, "uid", created.UID)
		return created, nil
	}
	// Not silent: volumes may be mounted for the old Node's pods.
	klog.FromContext(ctx).Error(errors.New("the Node the agent served was deleted"), "Created the Node again: serving the new Node",
		"node", k.name, "uid", created.UID, "deletedUID", prev)
	k.event(ctx, created.UID, EventNodeRecreated, fmt.Sprintf(
		"Node %s (UID %s) was deleted while csi-volmgr %s served it; csi-volmgr created it again (UID %s) and serves it. "+
			"What it mounted for the old Node's pods stays mounted until those pods are gone",
		k.name, prev, k.identity, created.UID))
	return created, nil
}

// writeErrLocked is nil while the keeper may write to the API server for
// its Node, as far as the Lease says: it holds it.
func (k *nodeKeeper) writeErrLocked() error {
	if k.own.contested {
		return fmt.Errorf("%w: another agent serves the Node", nodeowner.ErrNotOwned)
	}
	return k.lease.err()
}

// checkWrite tells whether the keeper may write to node, a version it
// just read: it carries the label, is the pinned Node, and the keeper
// holds the Lease.
func (k *nodeKeeper) checkWrite(node *corev1.Node) error {
	k.own.mu.Lock()
	defer k.own.mu.Unlock()
	if err := k.writeErrLocked(); err != nil {
		return err
	}
	return k.owner.Check(node.UID, node.Labels)
}

// checkLatest tells whether the keeper may write for its Node as the
// watch last saw it: it exists, carries the label and is the pinned Node.
func (k *nodeKeeper) checkLatest() error {
	k.own.mu.Lock()
	defer k.own.mu.Unlock()
	if k.own.latest == nil {
		return fmt.Errorf("%w: node %s does not exist", nodeowner.ErrNotOwned, k.name)
	}
	return k.owner.Check(k.own.latest.UID, k.own.latest.Labels)
}

// contested makes the agent act on nothing, for good, because holder
// renews the Node's Lease: one error line, EventNodeLeaseHeldByAnother.
func (k *nodeKeeper) contested(ctx context.Context, holder string) {
	k.own.mu.Lock()
	was := k.own.contested
	k.own.contested = true
	k.own.mu.Unlock()
	if was {
		return
	}
	reason := fmt.Sprintf("another csi-volmgr (%s) renews the Lease %s/%s of node %s, so it serves this Node; this one (%s) acts on nothing "+
		"until it is restarted: two agents must not serve one Node (one --node-name on two hosts, e.g. a cloned image)",
		holder, corev1.NamespaceNodeLease, k.name, k.name, k.identity)
	k.owner.Hold(reason)
	klog.FromContext(ctx).Error(errLeaseHeld, "Not acting on the Node: another agent serves it",
		"node", k.name, "holderIdentity", holder, "identity", k.identity)
	var uid types.UID
	if node := k.latestNode(); node != nil {
		uid = node.UID
	}
	k.event(ctx, uid, EventNodeLeaseHeldByAnother, reason)
}

// latestNode returns the Node's latest version seen, nil when it does
// not exist.
func (k *nodeKeeper) latestNode() *corev1.Node {
	k.own.mu.Lock()
	defer k.own.mu.Unlock()
	return k.own.latest
}

// event records a Warning Event on the Node of uid, as the kubelet
// records its Node's Events (namespace default). Events are written even
// while the Gate is closed: they say why.
func (k *nodeKeeper) event(ctx context.Context, uid types.UID, reason, message string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", k.name, now.UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: k.name, UID: uid},
		Reason:         reason, Message: message, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: status.Component, Host: k.name},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := k.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).Info("Cannot record the Node's Event", "node", k.name, "reason", reason, "err", err)
	}
}

// ownedNodes is the Node client of virtual-kubelet's NodeController, which
// calls Get, Create and Patch (status) only: the Node is created only by
// createNode, and a patch is sent only after checkWrite on the version the
// controller read just before (its three-way patch is computed from it),
// with that version's UID and resourceVersion as preconditions. A version
// without OwnerLabel is never patched, so the controller, which would put
// its labels back, never puts OwnerLabel back; a change between the read
// and the patch fails it with Conflict, and the controller reads again.
type ownedNodes struct {
	typedcorev1.NodeInterface
	k *nodeKeeper

	// mu protects read.
	mu sync.Mutex
	// read is the Node version the controller read last.
	read *corev1.Node
}

func (n *ownedNodes) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	node, err := n.NodeInterface.Get(ctx, name, opts)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.read = nil
	if err == nil {
		n.read = node.DeepCopy()
	}
	return node, err
}

func (n *ownedNodes) Create(ctx context.Context, node *corev1.Node, opts metav1.CreateOptions) (*corev1.Node, error) {
	return n.k.createNode(ctx, n.NodeInterface, node, opts)
}

func (n *ownedNodes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions,
	subresources ...string) (*corev1.Node, error) {
	n.mu.Lock()
	read := n.read
	n.mu.Unlock()
	if read == nil || read.Name != name {
		return nil, fmt.Errorf("%w: patching Node %s without reading it first", nodeowner.ErrNotOwned, name)
	}
	if err := n.k.checkWrite(read); err != nil {
		return nil, err
	}
	data, err := withPreconditions(data, read)
	if err != nil {
		return nil, err
	}
	return n.NodeInterface.Patch(ctx, name, pt, data, opts, subresources...)
}

// withPreconditions sets the UID and resourceVersion of read in the JSON
// patch data: the API server applies it to that version of the Node only
// (a merge or strategic merge patch with a resourceVersion fails with
// Conflict on any other, one with another UID is Invalid).
func withPreconditions(data []byte, read *corev1.Node) ([]byte, error) {
	var patch map[string]any
	if err := json.Unmarshal(data, &patch); err != nil {
		return nil, fmt.Errorf("decoding the Node patch: %w", err)
	}
	if patch == nil {
		patch = map[string]any{}
	}
	meta, _ := patch["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["uid"], meta["resourceVersion"] = string(read.UID), read.ResourceVersion
	patch["metadata"] = meta
	return json.Marshal(patch)
}
