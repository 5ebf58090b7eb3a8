package volumemanager_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

// TestPodMarkedForDeletionIsDeletedAfterItsVolumeIsTornDown runs the volume
// manager with RegisterNode (the Node registered by the agent, terminating
// pods torn down and their deletion completed) and the real plugin: a pod
// deleted gracefully stays in the API until its volume is unpublished and
// unstaged, then the agent completes the deletion.
func TestPodMarkedForDeletionIsDeletedAfterItsVolumeIsTornDown(t *testing.T) {
	f := k8stest.New(t)
	ctx := t.Context()
	t.Cleanup(func() {
		_ = f.Client.CoreV1().Nodes().Delete(context.WithoutCancel(t.Context()), f.NodeName, metav1.DeleteOptions{})
	})
	n := startClusterNode(t, f, func(c *volumemanager.Config) { c.RegisterNode = true })
	vm, handle, pvcName := n.vm, n.handle, "data"

	pods := f.Client.CoreV1().Pods(f.Namespace)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName:   f.NodeName,
			Containers: []corev1.Container{{Name: "app", Image: "i", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvcName},
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, "the volume to be published", func(context.Context) (bool, error) {
		for _, v := range vm.Volumes() {
			if v.Handle == handle && len(v.Pods) == 1 && v.Pods[0].State.String() == "Published" {
				return true, nil
			}
		}
		return false, nil
	})

	// A graceful delete of a bound pod only marks it for deletion.
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the agent to complete the pod's deletion", func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	// The pod went only after its volume was unpublished from it (the
	// unstage is the volume's, not the pod's, and may come later, as with
	// the kubelet).
	calls := func() []string { return n.okCalls(t) }
	if got := calls(); len(got) < 3 || !slices.Equal(got[:3], []string{"NodeStageVolume", "NodePublishVolume", "NodeUnpublishVolume"}) {
		t.Errorf("CSI calls when the pod was gone: %v, want NodeStageVolume, NodePublishVolume, NodeUnpublishVolume first", got)
	}
	poll(t, "the unstage", func(context.Context) (bool, error) {
		return len(vm.Volumes()) == 0 && slices.Contains(calls(), "NodeUnstageVolume"), nil
	})
}

// createBound creates a PV of driver/handle (changed by changePV) and a
// PVC bound to it, as the PV controller (not running here) would leave
// them.
func createBound(t *testing.T, f *k8stest.Fixture, driver, handle, pvcName, pvName string, changePV ...func(*corev1.PersistentVolume)) {
	t.Helper()
	ctx := t.Context()
	size := resource.MustParse("1Gi")
	pvc, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: pvcName, Namespace: f.Namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			VolumeName:  pvName, StorageClassName: ptr.To(""),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef:    &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: f.Namespace, Name: pvcName, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: handle,
			}},
		},
	}
	for _, change := range changePV {
		change(pv)
	}
	if _, err := f.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.Client.CoreV1().PersistentVolumes().Delete(context.WithoutCancel(t.Context()), pvName, metav1.DeleteOptions{})
	})
	pvc.Status.Phase = corev1.ClaimBound
	if _, err := f.Client.CoreV1().PersistentVolumeClaims(f.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func poll(t *testing.T, what string, cond wait.ConditionWithContextFunc) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, standaloneTimeout, true, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
