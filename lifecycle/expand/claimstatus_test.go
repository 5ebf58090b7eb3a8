package expand

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func resizingClaim() *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns", ResourceVersion: "7"},
		Status: corev1.PersistentVolumeClaimStatus{
			Phase:              corev1.ClaimBound,
			Capacity:           corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AllocatedResources: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")},
			AllocatedResourceStatuses: map[corev1.ResourceName]corev1.ClaimResourceStatus{
				corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizeInProgress,
			},
			Conditions: []corev1.PersistentVolumeClaimCondition{
				{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue},
				{Type: "SomeoneElses", Status: corev1.ConditionTrue},
			},
		},
	}
}

// TestClaimStatusWrites checks the claim status the kubelet writes: after
// a node expansion the capacity, no storage resize status, no resize
// condition (others kept); after a final error the NodeResizeError
// condition with the driver's message and, when infeasible,
// NodeResizeInfeasible.
func TestClaimStatusWrites(t *testing.T) {
	ctx := t.Context()
	client := fake.NewClientset(resizingClaim())
	w := claimWriter{client: client, now: func() metav1.Time { return metav1.NewTime(time.Unix(100, 0)) }}

	done, err := w.markFinished(ctx, resizingClaim(), resource.MustParse("2Gi"))
	if err != nil {
		t.Fatal(err)
	}
	if c := done.Status.Capacity[corev1.ResourceStorage]; c.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("capacity = %s, want 2Gi", c.String())
	}
	if _, ok := done.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; ok {
		t.Errorf("allocatedResourceStatuses still has storage: %v", done.Status.AllocatedResourceStatuses)
	}
	if len(done.Status.Conditions) != 1 || done.Status.Conditions[0].Type != "SomeoneElses" {
		t.Errorf("conditions = %v, want only the one a resize does not own", done.Status.Conditions)
	}

	client = fake.NewClientset(resizingClaim())
	w.client = client
	failed, err := w.markFailed(ctx, resizingClaim(), errors.New("rpc error: code = InvalidArgument desc = no room"), true)
	if err != nil {
		t.Fatal(err)
	}
	if st := failed.Status.AllocatedResourceStatuses[corev1.ResourceStorage]; st != corev1.PersistentVolumeClaimNodeResizeInfeasible {
		t.Errorf("allocatedResourceStatuses[storage] = %q, want NodeResizeInfeasible", st)
	}
	var nodeErr *corev1.PersistentVolumeClaimCondition
	for i := range failed.Status.Conditions {
		if failed.Status.Conditions[i].Type == corev1.PersistentVolumeClaimNodeResizeError {
			nodeErr = &failed.Status.Conditions[i]
		}
	}
	if nodeErr == nil || nodeErr.Message != "failed to expand pvc with rpc error: code = InvalidArgument desc = no room" {
		t.Errorf("NodeResizeError condition = %+v, want the driver's message", nodeErr)
	}
	if len(failed.Status.Conditions) != 3 {
		t.Errorf("conditions = %v, want the old ones kept and NodeResizeError added", failed.Status.Conditions)
	}
}

// TestClaimPatchCarriesResourceVersion: the writes that move a resize on
// are preconditioned on the claim's resourceVersion.
func TestClaimPatchCarriesResourceVersion(t *testing.T) {
	old := resizingClaim()
	next := old.DeepCopy()
	setResourceStatus(next, corev1.PersistentVolumeClaimNodeResizeInProgress)
	next.Status.Capacity[corev1.ResourceStorage] = resource.MustParse("2Gi")
	data, err := claimPatch(old, next, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"resourceVersion":"7"`; !strings.Contains(string(data), want) {
		t.Errorf("patch %s lacks %s", data, want)
	}
}
