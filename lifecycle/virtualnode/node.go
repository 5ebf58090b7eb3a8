package virtualnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ControllerManagedAttachAnnotation makes the attach/detach controller
// attach and detach the node's volumes (the kubelet sets it when it
// registers).
const ControllerManagedAttachAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"

// Values of the Ready condition the agent posts.
const (
	ReadyReason  = "CSIVolmgrReady"
	ReadyMessage = "csi-volmgr is posting ready status (volumes only: this node runs no containers)"
)

// The kubelet's defaults: a 40s node Lease renewed every quarter of it, and
// the node status re-posted at least every 5 minutes even when unchanged.
const (
	DefaultLeaseDuration      = 40 * time.Second
	DefaultStatusReportPeriod = 5 * time.Minute
	renewFraction             = 0.25
)

// Config configures a Node.
type Config struct {
	// Client writes the Node and its Lease. Required.
	Client kubernetes.Interface
	// NodeName is the Node's name. Required.
	NodeName string
	// LeaseDuration is the Lease's leaseDurationSeconds; it is renewed
	// every quarter of it. 0 means 40s.
	LeaseDuration time.Duration
	// StatusReportPeriod is how often the Ready condition's heartbeat is
	// posted when nothing changed; 0 means 5m.
	StatusReportPeriod time.Duration
	// Clock stamps the Lease and the condition; nil is the real clock.
	Clock clock.WithTicker
	// RetryBaseDelay and RetryMaxDelay bound the backoff of Register; 0
	// means 500ms and 30s.
	RetryBaseDelay, RetryMaxDelay time.Duration
}

// Node registers and keeps the Node object of a node that has no kubelet;
// see the package documentation.
type Node struct {
	cfg   Config
	queue workqueue.TypedRateLimitingInterface[string]

	// mu protects uid.
	mu sync.Mutex
	// uid is the UID of the Node as last seen, for the Lease's owner.
	uid types.UID
}

// New returns a Node; Register creates it in the API, Run keeps it.
func New(cfg Config) (*Node, error) {
	if cfg.Client == nil || cfg.NodeName == "" {
		return nil, errors.New("virtualnode: Client and NodeName are required")
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.StatusReportPeriod == 0 {
		cfg.StatusReportPeriod = DefaultStatusReportPeriod
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.RetryBaseDelay == 0 {
		cfg.RetryBaseDelay = 500 * time.Millisecond
	}
	if cfg.RetryMaxDelay == 0 {
		cfg.RetryMaxDelay = 30 * time.Second
	}
	return &Node{
		cfg: cfg,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "csi_volmgr_node"}),
	}, nil
}

// Register creates the Node, or brings an existing one in line: the labels
// kubernetes.io/hostname, kubernetes.io/os and kubernetes.io/arch, the
// attach/detach annotation, and Ready=True. It retries until it succeeds or
// ctx ends, except when the API refuses for good (Forbidden, Unauthorized,
// Invalid): then the agent cannot serve the node, and it says why.
func (n *Node) Register(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// Not wait.ExponentialBackoff: a Backoff whose delay reaches its Cap
	// ends its steps, and the agent would give up after half a minute of an
	// API server outage.
	backoff := wait.Backoff{Duration: n.cfg.RetryBaseDelay, Factor: 2, Jitter: 0.1, Cap: n.cfg.RetryMaxDelay, Steps: math.MaxInt32}
	for {
		err := n.ensure(ctx)
		switch {
		case err == nil:
			logger.Info("Node registered", "node", n.cfg.NodeName)
			return nil
		case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsInvalid(err):
			return fmt.Errorf("registering Node %s: %w", n.cfg.NodeName, err)
		}
		logger.Error(err, "Registering the Node failed; will retry", "node", n.cfg.NodeName)
		t := time.NewTimer(backoff.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("registering Node %s: %w (last error: %w)", n.cfg.NodeName, context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// Run renews the node's Lease and keeps the Node registered and Ready until
// ctx ends: a Ready condition that someone else turned (the node lifecycle
// controller after missed heartbeats), a lost label or annotation, or a
// deleted Node are put back as soon as the watch shows them, and the
// condition's heartbeat is posted every StatusReportPeriod. The Node and
// its Lease are left in place on return, as a kubelet leaves them.
func (n *Node) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("node")
	ctx = klog.NewContext(ctx, logger)
	renew := time.Duration(float64(n.cfg.LeaseDuration) * renewFraction)
	leases := lease.NewController(n.cfg.Clock, n.cfg.Client, n.cfg.NodeName, int32(n.cfg.LeaseDuration/time.Second),
		nil, renew, n.cfg.NodeName, corev1.NamespaceNodeLease, n.setOwner(ctx))

	factory := informers.NewSharedInformerFactoryWithOptions(n.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", n.cfg.NodeName).String()
		}))
	inf := factory.Core().V1().Nodes().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n.nodeChanged(obj, false) },
		UpdateFunc: func(_, obj any) { n.nodeChanged(obj, false) },
		DeleteFunc: func(obj any) { n.nodeChanged(obj, true) },
	}); err != nil {
		logger.Error(err, "Watching the Node failed; it is kept by the periodic status report only")
	}
	factory.Start(ctx.Done())

	var wg sync.WaitGroup
	wg.Go(func() { leases.Run(ctx) })
	wg.Go(func() {
		for n.processNext(ctx) {
		}
	})
	wg.Go(func() {
		t := n.cfg.Clock.NewTicker(n.cfg.StatusReportPeriod)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
				n.queue.Add(n.cfg.NodeName)
			}
		}
	})
	<-ctx.Done()
	n.queue.ShutDown()
	factory.Shutdown()
	wg.Wait()
}

// nodeChanged enqueues a repair when the Node lacks what Register gives it
// or is gone.
func (n *Node) nodeChanged(obj any, deleted bool) {
	node, ok := obj.(*corev1.Node)
	if deleted || !ok || n.needsRepair(node) {
		n.queue.Add(n.cfg.NodeName)
	}
}

func (n *Node) processNext(ctx context.Context) bool {
	key, shutdown := n.queue.Get()
	if shutdown {
		return false
	}
	defer n.queue.Done(key)
	if err := n.ensure(ctx); err != nil {
		if ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Keeping the Node failed; will retry", "node", n.cfg.NodeName)
			n.queue.AddRateLimited(key)
		}
		return true
	}
	n.queue.Forget(key)
	return true
}

// ensure creates the Node if it is missing, patches its labels and
// annotation if they differ, and posts the Ready condition with a fresh
// heartbeat.
func (n *Node) ensure(ctx context.Context) error {
	nodes := n.cfg.Client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, n.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nodes.Create(ctx, n.newNode(), metav1.CreateOptions{})
		if err == nil {
			klog.FromContext(ctx).Info("Created Node", "node", n.cfg.NodeName)
		}
	}
	if err != nil {
		return err
	}
	n.setUID(node.UID)
	if patch := n.metadataPatch(node); patch != nil {
		if node, err = nodes.Patch(ctx, n.cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("patching the Node's labels and annotations: %w", err)
		}
	}
	patch, err := n.readyPatch(node)
	if err != nil {
		return err
	}
	if _, err := nodes.PatchStatus(ctx, n.cfg.NodeName, patch); err != nil {
		return fmt.Errorf("posting the Node's Ready condition: %w", err)
	}
	klog.FromContext(ctx).V(4).Info("Posted the Node's Ready condition", "node", n.cfg.NodeName)
	return nil
}

// labels are the labels the Node carries, as the kubelet's default labels.
func (n *Node) labels() map[string]string {
	return map[string]string{
		corev1.LabelHostname:   n.cfg.NodeName,
		corev1.LabelOSStable:   runtime.GOOS,
		corev1.LabelArchStable: runtime.GOARCH,
	}
}

func (n *Node) newNode() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        n.cfg.NodeName,
		Labels:      n.labels(),
		Annotations: map[string]string{ControllerManagedAttachAnnotation: "true"},
	}}
}

// needsRepair says whether the Node lacks a label, the annotation or the
// Ready=True condition.
func (n *Node) needsRepair(node *corev1.Node) bool {
	if n.metadataPatch(node) != nil {
		return true
	}
	c := readyCondition(node)
	return c == nil || c.Status != corev1.ConditionTrue
}

// metadataPatch returns the strategic merge patch that gives the Node the
// labels and annotation, or nil when it has them.
func (n *Node) metadataPatch(node *corev1.Node) []byte {
	labels := map[string]string{}
	for k, v := range n.labels() {
		if node.Labels[k] != v {
			labels[k] = v
		}
	}
	annotations := map[string]string{}
	if node.Annotations[ControllerManagedAttachAnnotation] != "true" {
		annotations[ControllerManagedAttachAnnotation] = "true"
	}
	if len(labels) == 0 && len(annotations) == 0 {
		return nil
	}
	meta := map[string]any{}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	data, _ := json.Marshal(map[string]any{"metadata": meta})
	return data
}

// readyPatch is the strategic merge patch of status.conditions that posts
// Ready=True with a fresh heartbeat. Conditions merge by type, so other
// conditions and status.volumesInUse (written by lifecycle/status) stay as
// they are. The transition time is kept while the condition stays True.
func (n *Node) readyPatch(node *corev1.Node) ([]byte, error) {
	now := metav1.NewTime(n.cfg.Clock.Now())
	transition := now
	if c := readyCondition(node); c != nil && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
		transition = c.LastTransitionTime
	}
	cond := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: ReadyReason, Message: ReadyMessage,
		LastHeartbeatTime: now, LastTransitionTime: transition,
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return nil, fmt.Errorf("encoding the Ready condition: %w", err)
	}
	return data, nil
}

func readyCondition(node *corev1.Node) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

func (n *Node) setUID(uid types.UID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.uid = uid
}

// setOwner makes the Node the owner of its Lease, as the kubelet does, so
// that the Lease goes with the Node. A Lease owned by an earlier Node of the
// same name gets the current one.
func (n *Node) setOwner(ctx context.Context) lease.ProcessLeaseFunc {
	return func(l *coordinationv1.Lease) error {
		n.mu.Lock()
		uid := n.uid
		n.mu.Unlock()
		if uid == "" {
			node, err := n.cfg.Client.CoreV1().Nodes().Get(ctx, n.cfg.NodeName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("getting the Node to own its Lease: %w", err)
			}
			uid = node.UID
		}
		owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: n.cfg.NodeName, UID: uid}
		if len(l.OwnerReferences) != 1 || l.OwnerReferences[0] != owner {
			l.OwnerReferences = []metav1.OwnerReference{owner}
		}
		return nil
	}
}
