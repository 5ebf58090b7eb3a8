package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconstruct"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// noDrivers is a driver layer with no driver registered.
type noDrivers struct{}

func (noDrivers) Client(string) (*csiclient.Client, bool) { return nil, false }
func (noDrivers) NodeID(string) (string, bool)            { return "", false }
func (noDrivers) OnRegistered(func(string))               {}
func (noDrivers) OnReconnected(func(string))              {}

// defaultPolicies gives every driver the kubelet's defaults.
type defaultPolicies struct{}

func (defaultPolicies) Get(string) volume.Policy { return volume.DefaultPolicy() }
func (defaultPolicies) OnChange(func(string))    {}
func (defaultPolicies) HasSynced() bool          { return true }

// TestDesiredStateBuiltWhileReconstructing: the sources and the populator
// build the desired state while the actual state is still being rebuilt
// from disk (a restart with thousands of volumes read its records and then
// the objects, one after the other: issue 24), and nothing that acts or
// reports — the reconciler, the pod conditions, node.status.volumesInUse,
// readiness — starts before the actual state is whole.
func TestDesiredStateBuiltWhileReconstructing(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	entered, release := make(chan struct{}), make(chan struct{})
	rebuild := rebuildActualState
	rebuildActualState = func(ctx context.Context, layout paths.Layout, mounts reconstruct.Mounts, st reconstruct.ActualState) (reconstruct.Result, error) {
		close(entered)
		select {
		case <-release:
		case <-ctx.Done():
			return reconstruct.Result{}, ctx.Err()
		}
		return rebuild(ctx, layout, mounts, st)
	}
	t.Cleanup(func() { rebuildActualState = rebuild })

	const nodeName, driver = "node-a", "csi.example.com"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-a-uid", Labels: map[string]string{nodeowner.Label: nodeowner.Value}}}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "vol-1"}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "ns", Name: "data"},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data"},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1", AccessModes: pv.Spec.AccessModes},
		Status:     corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: pv.Spec.Capacity},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "pod-1"},
		Spec: corev1.PodSpec{
			NodeName:   nodeName,
			Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes:    []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		},
	}
	client := fake.NewClientset(node, pv, pvc, pod)
	m, err := New(ctx, Config{Client: client, NodeName: nodeName, RootDir: t.TempDir(), Drivers: noDrivers{}, Policies: defaultPolicies{}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()

	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the actual state was never rebuilt")
	}
	select {
	case <-m.pop.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("the desired state did not sync while the actual state was being rebuilt")
	}
	if counts := m.desire.Counts(); counts.PodVolumesByDriver[driver] != 1 {
		t.Errorf("desired state while rebuilding the actual state: %v pod volumes of %s, want the pod's 1", counts.PodVolumesByDriver[driver], driver)
	}
	if m.Ready() {
		t.Error("ready before the actual state was whole")
	}
	select {
	case <-m.Reconstructed():
		t.Error("Reconstructed closed before the actual state was whole")
	default:
	}
	for _, a := range client.Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("%s %s/%s before the actual state was whole", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
		}
	}

	close(release)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return m.Ready(), nil
	}); err != nil {
		t.Fatal("not ready after the actual state was rebuilt")
	}
	// The outputs run now: the pod's condition is written (not ready: its
	// driver is not registered).
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" && a.GetResource().Resource == "pods" && a.GetSubresource() == "status" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error("no pod condition written once the actual state was whole")
	}
}
