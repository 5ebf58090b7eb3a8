package source_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// settleResync is the re-read period of the settled objects in these tests.
const settleResync = 100 * 1e6 // 100ms

func boundPVC(rv string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
	c := pvc("ns", "data", rv)
	c.Spec.VolumeName = "pv-data"
	c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	c.Status.Phase = phase
	c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	return c
}

func boundPV(rv, size string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-data", ResourceVersion: rv},
		Spec: corev1.PersistentVolumeSpec{
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "uid-data"},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

func startSettling(t *testing.T, client *fake.Clientset) (*source.Source, *events) {
	t.Helper()
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	src, err := source.New(ctx, source.Config{Client: client, NodeName: node, SettledObjectResync: settleResync})
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{pods: make(chan types.UID, 1000), attachments: make(chan volume.Name, 1000)}
	src.OnPodChange(func(uid types.UID) { ev.pods <- uid })
	src.OnAttachmentChange(func(n volume.Name) { ev.attachments <- n })
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); src.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !cache.WaitForCacheSync(ctx.Done(), src.HasSynced) {
		t.Fatal("source did not sync")
	}
	return src, ev
}

// TestSettledObjectsAreNotWatched: with SettledObjectResync, a bound claim
// and a bound volume are read and cached without a watch, and a change to
// them (an expansion of the volume) is still seen, by the periodic GET; a
// claim that is not bound yet is watched until it is, and its pods are
// told when it binds.
func TestSettledObjectsAreNotWatched(t *testing.T) {
	client := fake.NewClientset(boundPVC("1", corev1.ClaimBound), boundPV("1", "1Gi"))
	src, ev := startSettling(t, client)
	src.AddReferences("pod-1", source.References{
		PVCs: []cache.ObjectName{{Namespace: "ns", Name: "data"}}, PVs: []string{"pv-data"}})
	eventually(t, "claim and volume cached", func() bool {
		_, e1 := src.PVC("ns", "data")
		_, e2 := src.PV("pv-data")
		return e1 == nil && e2 == nil
	})
	st := src.Stats()
	if st.Watches[source.KindPersistentVolumeClaim] != 0 || st.Watches[source.KindPersistentVolume] != 0 {
		t.Errorf("watches of settled objects: PVC %d, PV %d; want none", st.Watches[source.KindPersistentVolumeClaim], st.Watches[source.KindPersistentVolume])
	}
	if st.Objects[source.KindPersistentVolumeClaim] != 1 || st.Objects[source.KindPersistentVolume] != 1 {
		t.Errorf("cached: PVC %d, PV %d; want 1 and 1", st.Objects[source.KindPersistentVolumeClaim], st.Objects[source.KindPersistentVolume])
	}

	// The volume is expanded: the periodic read sees it and tells the pod.
	drain(ev.pods)
	if _, err := client.CoreV1().PersistentVolumes().Update(t.Context(), boundPV("2", "2Gi"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.pods, "pod-1", "volume expanded")
	eventually(t, "new capacity cached", func() bool {
		pv, err := src.PV("pv-data")
		q := pv.Spec.Capacity[corev1.ResourceStorage]
		return err == nil && q.Cmp(resource.MustParse("2Gi")) == 0
	})

	// A claim that becomes unbound is watched again; bound again, its
	// watch ends and the pod is told.
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(t.Context(), boundPVC("3", corev1.ClaimPending), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pending claim watched", func() bool { return src.Stats().Watches[source.KindPersistentVolumeClaim] == 1 })
	drain(ev.pods)
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(t.Context(), boundPVC("4", corev1.ClaimBound), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.pods, "pod-1", "claim bound")
	eventually(t, "bound claim's watch ended", func() bool { return src.Stats().Watches[source.KindPersistentVolumeClaim] == 0 })

	// The last reference goes: nothing is cached or read any more.
	src.SetReferences("pod-1", source.References{})
	if st := src.Stats(); st.Objects[source.KindPersistentVolumeClaim] != 0 || st.Objects[source.KindPersistentVolume] != 0 {
		t.Errorf("after the last reference: cached PVC %d, PV %d", st.Objects[source.KindPersistentVolumeClaim], st.Objects[source.KindPersistentVolume])
	}
}
