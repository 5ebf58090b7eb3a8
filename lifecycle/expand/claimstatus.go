package expand

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
)

// The PVC status writes of node expansion, as the kubelet's
// pkg/volume/util/resize_util.go makes them: each is a strategic merge
// patch of the claim's status computed from the claim as read; the ones
// that move the resize forward carry the claim's resourceVersion, so that
// they fail with Conflict instead of overwriting a newer status (the step
// is then retried, on the claim read again: Expander.readClaim).

// resizeConditions are the claim conditions a resize owns
// (knownResizeConditions): merging resize conditions keeps every other
// condition.
var resizeConditions = map[corev1.PersistentVolumeClaimConditionType]bool{
	corev1.PersistentVolumeClaimFileSystemResizePending: true,
	corev1.PersistentVolumeClaimResizing:                true,
	corev1.PersistentVolumeClaimControllerResizeError:   true,
	corev1.PersistentVolumeClaimNodeResizeError:         true,
}

// claimWriter patches claim statuses.
type claimWriter struct {
	client kubernetes.Interface
	now    func() metav1.Time
}

// markInProgress sets allocatedResourceStatuses[storage] =
// NodeResizeInProgress (MarkNodeExpansionInProgress).
func (w claimWriter) markInProgress(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	next := pvc.DeepCopy()
	setResourceStatus(next, corev1.PersistentVolumeClaimNodeResizeInProgress)
	return w.patch(ctx, pvc, next, true)
}

// markFinished sets status.capacity[storage] = size, clears
// allocatedResourceStatuses[storage] and removes every resize condition
// (MarkNodeExpansionFinishedWithRecovery, and MarkFSResizeFinished of the
// older resizers' FileSystemResizePending path).
func (w claimWriter) markFinished(ctx context.Context, pvc *corev1.PersistentVolumeClaim, size resource.Quantity) (*corev1.PersistentVolumeClaim, error) {
	next := pvc.DeepCopy()
	if next.Status.Capacity == nil {
		next.Status.Capacity = corev1.ResourceList{}
	}
	next.Status.Capacity[corev1.ResourceStorage] = size
	delete(next.Status.AllocatedResourceStatuses, corev1.ResourceStorage)
	if len(next.Status.AllocatedResourceStatuses) == 0 {
		next.Status.AllocatedResourceStatuses = nil
	}
	mergeResizeConditions(next, nil, false)
	return w.patch(ctx, pvc, next, true)
}

// markFailed adds the NodeResizeError condition with the driver's error
// (MarkNodeExpansionFailedCondition); with infeasible also
// allocatedResourceStatuses[storage] = NodeResizeInfeasible
// (MarkNodeExpansionInfeasible), which stops the node from retrying until
// the user changes the claim.
func (w claimWriter) markFailed(ctx context.Context, pvc *corev1.PersistentVolumeClaim, cause error, infeasible bool) (*corev1.PersistentVolumeClaim, error) {
	next := pvc.DeepCopy()
	if infeasible {
		setResourceStatus(next, corev1.PersistentVolumeClaimNodeResizeInfeasible)
	}
	mergeResizeConditions(next, []corev1.PersistentVolumeClaimCondition{{
		Type:               corev1.PersistentVolumeClaimNodeResizeError,
		Status:             corev1.ConditionTrue,
		LastTransitionTime: w.now(),
		Message:            fmt.Sprintf("failed to expand pvc with %v", cause),
	}}, true)
	return w.patch(ctx, pvc, next, false)
}

// patch writes the difference of next from pvc to the claim's status.
func (w claimWriter) patch(ctx context.Context, pvc, next *corev1.PersistentVolumeClaim, withResourceVersion bool) (*corev1.PersistentVolumeClaim, error) {
	data, err := claimPatch(pvc, next, withResourceVersion)
	if err != nil {
		return pvc, err
	}
	updated, err := w.client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Patch(ctx, pvc.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status")
	if err != nil {
		return pvc, fmt.Errorf("patching the status of PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return updated, nil
}

// claimPatch is the two-way strategic merge patch from old to next, with
// old's resourceVersion as a precondition when asked.
func claimPatch(old, next *corev1.PersistentVolumeClaim, withResourceVersion bool) ([]byte, error) {
	oldData, err := json.Marshal(old)
	if err != nil {
		return nil, fmt.Errorf("encoding PVC: %w", err)
	}
	newData, err := json.Marshal(next)
	if err != nil {
		return nil, fmt.Errorf("encoding PVC: %w", err)
	}
	data, err := strategicpatch.CreateTwoWayMergePatch(oldData, newData, old)
	if err != nil {
		return nil, fmt.Errorf("computing the PVC status patch: %w", err)
	}
	if !withResourceVersion {
		return data, nil
	}
	var patch map[string]any
	if err := json.Unmarshal(data, &patch); err != nil {
		return nil, fmt.Errorf("decoding the PVC status patch: %w", err)
	}
	meta, _ := patch["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		patch["metadata"] = meta
	}
	meta["resourceVersion"] = old.ResourceVersion
	return json.Marshal(patch)
}

// setResourceStatus sets allocatedResourceStatuses[storage].
func setResourceStatus(pvc *corev1.PersistentVolumeClaim, s corev1.ClaimResourceStatus) {
	if pvc.Status.AllocatedResourceStatuses == nil {
		pvc.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
	}
	pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] = s
}

// mergeResizeConditions puts conds into the claim's conditions
// (MergeResizeConditionOnPVC): conditions a resize does not own stay, a
// condition of conds replaces the one of its type when its status differs,
// and the other resize conditions stay only with keepOld.
func mergeResizeConditions(pvc *corev1.PersistentVolumeClaim, conds []corev1.PersistentVolumeClaimCondition, keepOld bool) {
	pending := map[corev1.PersistentVolumeClaimConditionType]*corev1.PersistentVolumeClaimCondition{}
	for i := range conds {
		pending[conds[i].Type] = &conds[i]
	}
	var out []corev1.PersistentVolumeClaimCondition
	for _, c := range pvc.Status.Conditions {
		if !resizeConditions[c.Type] {
			out = append(out, c)
			continue
		}
		if n, ok := pending[c.Type]; ok {
			if n.Status != c.Status {
				out = append(out, *n)
			} else {
				out = append(out, c)
			}
			delete(pending, c.Type)
		} else if keepOld {
			out = append(out, c)
		}
	}
	for i := range conds {
		if _, ok := pending[conds[i].Type]; ok {
			out = append(out, conds[i])
		}
	}
	pvc.Status.Conditions = out
}
