package source_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
	return startSettlingEvery(t, client, settleResync)
}

func startSettlingEvery(t *testing.T, client *fake.Clientset, period time.Duration) (*source.Source, *events) {
	t.Helper()
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	src, err := source.New(ctx, source.Config{Client: client, NodeName: node, SettledObjectResync: period})
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

// TestReadPVCReadsASettledClaimNow: ReadPVC reads the claim from the API
// server, not from the cache, which holds a settled claim as read up to a
// period ago; the cache takes what it read, and a claim no longer settled
// (a resize in flight) is watched again. An unreferenced claim is not read.
func TestReadPVCReadsASettledClaimNow(t *testing.T) {
	client := fake.NewClientset(boundPVC("1", corev1.ClaimBound), boundPV("1", "1Gi"))
	src, _ := startSettlingEvery(t, client, time.Hour)
	src.AddReferences("pod-1", source.References{
		PVCs: []cache.ObjectName{{Namespace: "ns", Name: "data"}}, PVs: []string{"pv-data"}})
	eventually(t, "claim cached", func() bool { _, err := src.PVC("ns", "data"); return err == nil })

	resizing := boundPVC("2", corev1.ClaimBound)
	resizing.Status.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{
		corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending}
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(t.Context(), resizing, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if c, _ := src.PVC("ns", "data"); c.ResourceVersion != "1" {
		t.Fatalf("the cache has the claim at resourceVersion %s before any read; the test needs it stale", c.ResourceVersion)
	}
	read, err := src.ReadPVC(t.Context(), "ns", "data")
	if err != nil {
		t.Fatal(err)
	}
	if read.ResourceVersion != "2" {
		t.Errorf("ReadPVC returned resourceVersion %s, want 2", read.ResourceVersion)
	}
	if c, _ := src.PVC("ns", "data"); c.ResourceVersion != "2" {
		t.Errorf("after ReadPVC the cache has resourceVersion %s, want 2", c.ResourceVersion)
	}
	eventually(t, "resizing claim watched", func() bool { return src.Stats().Watches[source.KindPersistentVolumeClaim] == 1 })

	if _, err := src.ReadPVC(t.Context(), "ns", "other"); !errors.Is(err, source.ErrNotReferenced) {
		t.Errorf("ReadPVC of an unreferenced claim: %v, want ErrNotReferenced", err)
	}
}
