package source

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// WatchNode tells fn of every version of the agent's Node (a watch of that
// one object) until ctx ends: the moment to restore what the agent owns in
// it (status.volumesInUse) when someone else overwrote it.
func WatchNode(ctx context.Context, client kubernetes.Interface, nodeName string, fn func(*corev1.Node)) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}))
	changed := func(obj any) {
		if node, ok := obj.(*corev1.Node); ok {
			fn(node)
		}
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
	}); err != nil {
		klog.FromContext(ctx).Error(err, "Watching the Node failed; volumesInUse is written on change only")
		return
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}
