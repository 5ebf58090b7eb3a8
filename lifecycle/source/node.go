package source

import (
	"context"
	"fmt"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Node watches this node's Node object: for its labels, which decide
// whether a PersistentVolume's nodeAffinity lets it be used here (the
// kubelet checks them before it mounts a volume), and for what the agent
// writes into it and others may overwrite (status.volumesInUse). One
// watch, filtered by name.
type Node struct {
	name     string
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer

	// mu protects handlers and updateHandlers.
	mu             sync.Mutex
	handlers       []func()
	updateHandlers []func(*corev1.Node)
}

// NewNode returns the watch of node name's labels; Run starts it.
func NewNode(client kubernetes.Interface, name string) (*Node, error) {
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	n := &Node{name: name}
	n.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }),
		informers.WithTransform(stripManagedFields))
	n.informer = n.factory.Core().V1().Nodes().Informer()
	if _, err := n.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(cur any) { n.changed(); n.version(cur) },
		UpdateFunc: func(old, cur any) { n.updated(old, cur); n.version(cur) },
		DeleteFunc: func(any) { n.changed() },
	}); err != nil {
		return nil, fmt.Errorf("adding the node event handler: %w", err)
	}
	return n, nil
}

// Labels returns the node's labels; false while the Node object is not
// known (not listed yet, or it does not exist). The map is a copy.
func (n *Node) Labels() (map[string]string, bool) {
	obj, exists, err := n.informer.GetIndexer().GetByKey(n.name)
	if err != nil || !exists {
		return nil, false
	}
	node, ok := obj.(*corev1.Node)
	if !ok {
		return nil, false
	}
	return maps.Clone(node.Labels), true
}

// Identity returns the node's UID and labels; false while the Node object
// is not known (not listed yet, or it does not exist). The map is a copy.
func (n *Node) Identity() (types.UID, map[string]string, bool) {
	obj, exists, err := n.informer.GetIndexer().GetByKey(n.name)
	if err != nil || !exists {
		return "", nil, false
	}
	node, ok := obj.(*corev1.Node)
	if !ok {
		return "", nil, false
	}
	return node.UID, maps.Clone(node.Labels), true
}

// OnChange subscribes fn to every change of the node's labels or UID (and
// to its creation and deletion). fn must not block.
func (n *Node) OnChange(fn func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.handlers = append(n.handlers, fn)
}

// OnUpdate subscribes fn to every version of the Node (its creation and
// every update, heartbeats included). fn must not block.
func (n *Node) OnUpdate(fn func(*corev1.Node)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.updateHandlers = append(n.updateHandlers, fn)
}

// HasSynced tells whether the node has been listed.
func (n *Node) HasSynced() bool { return n.informer.HasSynced() }

// Run watches the node until ctx ends.
func (n *Node) Run(ctx context.Context) {
	klog.FromContext(ctx).V(2).Info("Watching the node's labels", "node", n.name)
	n.factory.Start(ctx.Done())
	<-ctx.Done()
	n.factory.Shutdown()
}

func (n *Node) updated(old, cur any) {
	o, ok1 := old.(*corev1.Node)
	c, ok2 := cur.(*corev1.Node)
	if ok1 && ok2 && o.UID == c.UID && maps.Equal(o.Labels, c.Labels) {
		return // status heartbeats change nothing here
	}
	n.changed()
}

func (n *Node) changed() {
	n.mu.Lock()
	handlers := append([]func(){}, n.handlers...)
	n.mu.Unlock()
	for _, fn := range handlers {
		fn()
	}
}

func (n *Node) version(obj any) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	n.mu.Lock()
	handlers := append([]func(*corev1.Node){}, n.updateHandlers...)
	n.mu.Unlock()
	for _, fn := range handlers {
		fn(node)
	}
}

// WatchNode tells fn of every version of the Node named name (a watch of
// that one object) until ctx ends: for those outside the lifecycle that
// keep something in the Node.
func WatchNode(ctx context.Context, client kubernetes.Interface, name string, fn func(*corev1.Node)) {
	n, err := NewNode(client, name)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot watch the Node", "node", name)
		return
	}
	n.OnUpdate(fn)
	n.Run(ctx)
}
