package expand

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// annNodeExpansionNotRequired on a ReadWriteMany claim says that the
// other nodes need not expand a volume one node has expanded
// (volumetypes.NodeExpansionNotRequired).
const annNodeExpansionNotRequired = "volume.kubernetes.io/node-expansion-not-required"

// resize is one expansion of a volume on this node, from oldSize to
// newSize, for the pod of key: the kubelet's nodeExpandVolume and
// NodeExpander.
type resize struct {
	key              volume.PodKey
	use              dsw.Use
	pv               *corev1.PersistentVolume
	pvc              *corev1.PersistentVolumeClaim
	oldSize, newSize resource.Quantity
}

func (e *Expander) newResize(key volume.PodKey, use dsw.Use, pv *corev1.PersistentVolume, pvc *corev1.PersistentVolumeClaim, oldSize, newSize resource.Quantity) *resize {
	return &resize{key: key, use: use, pv: pv, pvc: pvc, oldSize: oldSize, newSize: newSize}
}

// run expands the volume if the claim's status allows it, and writes the
// claim's status as the kubelet does. done says the volume needs no more
// expansion on this node for now (expanded, or not allowed until the claim
// changes); size is the size it has then.
func (r *resize) run(ctx context.Context, e *Expander) (done bool, size resource.Quantity, err error) {
	if r.newSize.Cmp(r.oldSize) <= 0 {
		return true, r.oldSize, nil
	}
	if r.use.Volume.ReadOnly {
		msg := fmt.Sprintf("MountVolume.NodeExpandVolume failed for volume %q : requested read-only file system", r.use.Source.PVName)
		klog.FromContext(ctx).Info("Not expanding a volume mounted read-only", "volume", r.key.Volume, "pvc", klog.KObj(r.pvc))
		e.cfg.Events.Pod(r.use.Volume.Pod, corev1.EventTypeWarning, status.EventFileSystemResizeFailed, msg)
		e.cfg.Events.Claim(r.pvc.Namespace, r.pvc.Name, r.pvc.UID, corev1.EventTypeWarning, status.EventFileSystemResizeFailed, msg)
		return true, r.oldSize, nil
	}
	if recovers(r.pvc) {
		// The resizer keeps allocatedResources: expand to what it allocated.
		if allocated, ok := r.pvc.Status.AllocatedResources[corev1.ResourceStorage]; ok && !allocated.IsZero() {
			r.newSize = allocated
		}
		return r.expandWithRecovery(ctx, e)
	}
	return r.expandLegacy(ctx, e)
}

// recovers says whether the claim's resizer writes allocatedResources and
// allocatedResourceStatuses (checkForRecoveryFromExpansion); older
// resizers only set the FileSystemResizePending condition.
func recovers(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] != "" || pvc.Status.AllocatedResources != nil
}

// expandWithRecovery is node_expander.go's expandOnPlugin.
func (r *resize) expandWithRecovery(ctx context.Context, e *Expander) (bool, resource.Quantity, error) {
	logger := klog.FromContext(ctx).WithValues("volume", r.key.Volume, "pvc", klog.KObj(r.pvc))
	claimSize := r.pvc.Status.Capacity[corev1.ResourceStorage]
	resizeStatus := r.pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
	requested := r.pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	// The user lowered the request after a final failure: let the resizer
	// recover by marking this expansion infeasible should it fail again.
	markInfeasible := requested.Cmp(r.newSize) != 0 && e.flag(e.finalErr, r.key.Volume)
	alreadyUpdated := claimSize.Cmp(r.newSize) >= 0 && resizeStatus == ""

	allowed := false
	switch {
	case alreadyUpdated && hasAccessMode(r.pvc, corev1.ReadWriteMany) && !metav1.HasAnnotation(r.pvc.ObjectMeta, annNodeExpansionNotRequired):
		// Another node expanded a ReadWriteMany volume: this node must too.
		allowed = true
	case resizeStatus == corev1.PersistentVolumeClaimNodeResizePending, resizeStatus == corev1.PersistentVolumeClaimNodeResizeInProgress:
		allowed = true
	}
	if !allowed {
		if alreadyUpdated {
			return true, r.newSize, nil
		}
		logger.V(3).Info("NodeExpandVolume is not allowed to proceed", "resizeStatus", resizeStatus)
		return false, r.oldSize, nil
	}

	if !alreadyUpdated {
		pvc, err := e.writer.markInProgress(ctx, r.pvc)
		if err != nil {
			return false, r.oldSize, fmt.Errorf("marking node expansion in progress: %w", err)
		}
		r.pvc = pvc
	}
	_, err := e.cfg.Operations.Expand(ctx, r.key, r.use.Source, r.newSize.Value())
	if err != nil {
		notSupported := errors.Is(err, operations.ErrExpandNotSupported)
		if notSupported && alreadyUpdated {
			return true, r.newSize, nil
		}
		if notSupported || csiclient.IsFinal(err) {
			e.setFlag(e.finalErr, r.key.Volume)
			infeasible := isInfeasible(err) || markInfeasible
			pvc, markErr := e.writer.markFailed(ctx, r.pvc, err, infeasible)
			if markErr != nil {
				logger.Error(markErr, "Recording the failed node expansion in the claim's status failed")
			} else {
				r.pvc = pvc
			}
		}
		if grpcstatus.Code(err) == codes.FailedPrecondition {
			// The driver cannot expand this volume while it is in use: do
			// not retry on this node, and do not hold the mount back.
			e.setFlag(e.noOnline, r.key.Volume)
			logger.Error(err, "The driver cannot expand the volume while it is in use; not retrying on this node")
			return false, r.oldSize, nil
		}
		return false, r.oldSize, err
	}
	r.succeeded(ctx, e)
	if alreadyUpdated {
		return true, r.newSize, nil
	}
	if _, err := e.writer.markFinished(ctx, r.pvc, r.newSize); err != nil {
		return true, r.newSize, fmt.Errorf("NodeExpandVolume succeeded, updating the claim's status failed: %w", err)
	}
	return true, r.newSize, nil
}

// expandLegacy is legacyCallNodeExpandOnPlugin, for claims of resizers
// that do not write allocatedResources (FileSystemResizePending only).
func (r *resize) expandLegacy(ctx context.Context, e *Expander) (bool, resource.Quantity, error) {
	_, err := e.cfg.Operations.Expand(ctx, r.key, r.use.Source, r.newSize.Value())
	if err != nil {
		if errors.Is(err, operations.ErrExpandNotSupported) {
			return true, r.newSize, nil
		}
		if grpcstatus.Code(err) == codes.FailedPrecondition {
			e.setFlag(e.noOnline, r.key.Volume)
			return true, r.newSize, nil
		}
		return false, r.oldSize, err
	}
	r.succeeded(ctx, e)
	claimSize := r.pvc.Status.Capacity[corev1.ResourceStorage]
	if claimSize.Cmp(r.newSize) >= 0 {
		return true, r.newSize, nil
	}
	if _, err := e.writer.markFinished(ctx, r.pvc, r.newSize); err != nil {
		// NodeExpandVolume is repeated (and does nothing) on the retry.
		return false, r.oldSize, fmt.Errorf("NodeExpandVolume succeeded, updating the claim's status failed: %w", err)
	}
	return true, r.newSize, nil
}

// succeeded records the kubelet's success Events on the pod and the claim.
func (r *resize) succeeded(ctx context.Context, e *Expander) {
	msg := fmt.Sprintf("MountVolume.NodeExpandVolume succeeded for volume %q %s", r.use.Source.PVName, e.cfg.NodeName)
	e.cfg.Events.Pod(r.use.Volume.Pod, corev1.EventTypeNormal, status.EventFileSystemResizeSuccessful, msg)
	e.cfg.Events.Claim(r.pvc.Namespace, r.pvc.Name, r.pvc.UID, corev1.EventTypeNormal, status.EventFileSystemResizeSuccessful, msg)
	klog.FromContext(ctx).Info("Expanded volume on the node", "volume", r.key.Volume, "pvc", klog.KObj(r.pvc), "size", r.newSize.String())
}

// isInfeasible says whether the driver's error means the expansion cannot
// succeed with these arguments (csi/expander.go isInfeasibleError).
func isInfeasible(err error) bool {
	st, ok := grpcstatus.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
		return true
	}
	return false
}

func hasAccessMode(pvc *corev1.PersistentVolumeClaim, mode corev1.PersistentVolumeAccessMode) bool {
	for _, m := range pvc.Spec.AccessModes {
		if m == mode {
			return true
		}
	}
	return false
}
