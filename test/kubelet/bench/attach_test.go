package bench_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// attach does for an attach-required volume what the attach/detach
// controller and the external-attacher do once a pod that uses it is
// scheduled to the world's Node: a VolumeAttachment of the volume to the
// Node, named as both name it, marked attached; and the volume in
// node.status.volumesAttached, which the kubelet's reconciler reads before
// it lets WaitForAttach look at the VolumeAttachment. Both agents see the
// same objects: csi-volmgr reads the VolumeAttachment, the kubelet both.
func (w *world) attach(ctx context.Context, tb testing.TB, v benchVolume) {
	tb.Helper()
	storage := w.creator.StorageV1().VolumeAttachments()
	name := attachmentName(v.handle, w.driver, w.fx.NodeName)
	va, err := storage.Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: w.driver, NodeName: w.fx.NodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &v.pv},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("creating VolumeAttachment %s: %v", name, err)
	}
	tb.Cleanup(func() { _ = storage.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) })
	va.Status.Attached = true
	if _, err := storage.UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		tb.Fatalf("marking VolumeAttachment %s attached: %v", name, err)
	}

	nodes := w.creator.CoreV1().Nodes()
	attached := corev1.AttachedVolume{Name: corev1.UniqueVolumeName("kubernetes.io/csi/" + w.driver + "^" + v.handle)}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, w.fx.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if slices.Contains(node.Status.VolumesAttached, attached) {
			return nil
		}
		node.Status.VolumesAttached = append(node.Status.VolumesAttached, attached)
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		tb.Fatalf("adding %s to the Node's volumesAttached: %v", attached.Name, err)
	}
}

// attachmentName is the VolumeAttachment name of a CSI volume on a node,
// as the kubelet's and the attach/detach controller's CSI attacher make it
// (pkg/volume/csi getAttachmentName).
func attachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

// forgetVolumesInUse empties the Node's volumesInUse, which an agent that
// stopped leaves as it last wrote it, so that the next agent starts from
// the same Node as the first one did. Only between scenarios: no volume is
// in use then.
func (w *world) forgetVolumesInUse(ctx context.Context, tb testing.TB) {
	tb.Helper()
	nodes := w.creator.CoreV1().Nodes()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nodes.Get(ctx, w.fx.NodeName, metav1.GetOptions{})
		if err != nil || len(node.Status.VolumesInUse) == 0 {
			return err
		}
		node.Status.VolumesInUse = nil
		_, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		tb.Fatalf("emptying the Node's volumesInUse: %v", err)
	}
}
