package status

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// WatchNode keeps the Node's status.volumesInUse what this writer wrote,
// until ctx ends: when the Node, as watched, lists other volumes than the
// set last written (another writer of the node status replaced the list,
// e.g. a virtual-kubelet node controller whose provider's Node carried a
// stale copy of it), the set is written again. Only a difference is acted
// on; a stale event costs at most one more write.
func (v *VolumesInUse) WatchNode(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("volumes-in-use").WithValues("node", v.nodeName)
	factory := informers.NewSharedInformerFactoryWithOptions(v.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", v.nodeName).String()
		}))
	inf := factory.Core().V1().Nodes().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { v.nodeChanged(logger, obj) },
		UpdateFunc: func(_, obj any) { v.nodeChanged(logger, obj) },
	}); err != nil {
		logger.Error(err, "Cannot watch the Node; volumesInUse is not re-checked against other writers")
		return
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

// nodeChanged re-writes the set if the Node lists other volumes than the
// set last written.
func (v *VolumesInUse) nodeChanged(logger klog.Logger, obj any) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	seen := make([]volume.Name, 0, len(node.Status.VolumesInUse))
	for _, n := range node.Status.VolumesInUse {
		seen = append(seen, volume.Name(n))
	}
	seen = normalize(seen)
	v.mu.Lock()
	if v.reported == nil || slices.Equal(seen, v.reported) {
		v.mu.Unlock()
		return
	}
	dropped := difference(v.reported, seen)
	v.reported = seen
	v.mu.Unlock()
	logger.V(2).Info("The Node lists other volumes in use than written; writing them again", "dropped", dropped)
	v.queue.Add(inUseKey)
}
