package populator_test

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/populator"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestFollowsEvents: a pod that arrives later, a claim bound later, and the
// pod's deletion all reach the desired state without polling, and the
// references (and watches) go with the pod.
func TestFollowsEvents(t *testing.T) {
	for name, clusterWide := range map[string]bool{"by name": false, "cluster-wide informers": true} {
		t.Run(name, func(t *testing.T) { testFollowsEvents(t, clusterWide) })
	}
}

func testFollowsEvents(t *testing.T, clusterWide bool) {
	ctx := testContext(t)
	client := fakeClient()
	s := startStack(ctx, t, client, stackOptions{clusterWide: clusterWide})
	core := client.CoreV1()

	if _, err := core.PersistentVolumeClaims(ns).Create(ctx, newPVC("c1", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Pods(ns).Create(ctx, newPod("p", withClaim("data", "c1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "pod known with an unbound-claim error", func() bool {
		p, ok := s.store.Pod("uid-p")
		return ok && len(p.Errors) == 1 && p.Errors[0].Err.Error() == `PVC "ns/c1" is not bound`
	})

	// The PV appears, then the claim is bound to it.
	if _, err := core.PersistentVolumes().Create(ctx, newPV("pv1", "c1", "h1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := newPVC("c1", "pv1")
	bound.ResourceVersion = "2"
	if _, err := core.PersistentVolumeClaims(ns).Update(ctx, bound, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	key := volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"}
	eventually(ctx, t, "volume desired once the claim is bound", func() bool {
		_, ok := s.store.PodVolume(key)
		return ok && len(s.store.PodErrors("uid-p")) == 0
	})
	st := s.src.Stats()
	// By name: one watch per referenced object; cluster-wide: one per kind.
	for kind, want := range map[source.Kind]int{
		source.KindPersistentVolumeClaim: 1, source.KindPersistentVolume: 1, source.KindVolumeAttachment: 1,
	} {
		if st.Watches[kind] != want {
			t.Errorf("%s watches = %d, want %d", kind, st.Watches[kind], want)
		}
	}

	// The pod goes: its volume leaves and nothing is watched for it any more.
	if err := core.Pods(ns).Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "pod forgotten", func() bool { return !s.store.HasPod("uid-p") })
	if s.store.IsVolumeWanted(pvName("h1")) {
		t.Error("volume still wanted after its only pod was deleted")
	}
	if refs := s.src.References("uid-p"); len(refs.PVCs)+len(refs.PVs)+len(refs.Attachments) != 0 {
		t.Errorf("references left after the pod went: %+v", refs)
	}
	st = s.src.Stats()
	if n := st.Watches[source.KindPersistentVolumeClaim] + st.Watches[source.KindPersistentVolume] +
		st.Watches[source.KindVolumeAttachment]; !clusterWide && n != 0 {
		t.Errorf("watches left after the pod went: %+v", st.Watches)
	}
}

// TestKeepsVolumeOfRunningPod: once desired, a volume stays while its pod
// runs even if its claim no longer resolves (here: deleted without
// protection), as the kubelet, which never re-resolves a running pod.
func TestKeepsVolumeOfRunningPod(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(
		newPod("p", withClaim("data", "c1"), withClaim("logs", "c2")),
		newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"), newPVC("c2", ""))
	s := startStack(ctx, t, client, stackOptions{})
	core := client.CoreV1()
	key := volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"}
	if _, ok := s.store.PodVolume(key); !ok {
		t.Fatal("data is not desired at start")
	}

	deleting := newPVC("c1", "pv1")
	deleting.ResourceVersion = "2"
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if _, err := core.PersistentVolumeClaims(ns).Update(ctx, deleting, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "cache sees the claim being deleted", func() bool {
		c, err := s.src.PVC(ns, "c1")
		return err == nil && c.DeletionTimestamp != nil
	})
	// Binding c2 makes the populator resolve the pod again, reading c1 as
	// being deleted: logs enters, data must stay.
	if _, err := core.PersistentVolumes().Create(ctx, newPV("pv2", "c2", "h2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := newPVC("c2", "pv2")
	bound.ResourceVersion = "2"
	if _, err := core.PersistentVolumeClaims(ns).Update(ctx, bound, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "logs desired", func() bool {
		_, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h2"), Pod: "uid-p"})
		return ok
	})
	if _, ok := s.store.PodVolume(key); !ok {
		t.Error("data left the desired state of a running pod because its claim is being deleted")
	}
	if errs := s.store.PodErrors("uid-p"); len(errs) != 0 {
		t.Errorf("errors = %v, want none", errs)
	}
}

// TestKeepsVolumeOfRunningPodWhoseClaimNowNamesAnotherVolume: a running
// pod keeps the volume it has when its claim is recreated and bound to a PV
// of another volume (or its PV replaced by one with another handle); a new
// pod of the claim gets the new volume.
func TestKeepsVolumeOfRunningPodWhoseClaimNowNamesAnotherVolume(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"),
		newPV("pv2", "c1", "h2", func(pv *corev1.PersistentVolume) { pv.Spec.ClaimRef.UID = "uid-c1-again" }))
	// p's volume is published; nothing of q's is.
	s := startStack(ctx, t, client, stackOptions{published: publishedPods{"uid-p"}})
	old := volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"}
	if _, ok := s.store.PodVolume(old); !ok {
		t.Fatal("h1 is not desired at start")
	}
	core := client.CoreV1()
	if err := core.PersistentVolumeClaims(ns).Delete(ctx, "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := newPVC("c1", "pv2")
	again.UID, again.ResourceVersion = "uid-c1-again", "3"
	if _, err := core.PersistentVolumeClaims(ns).Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Pods(ns).Create(ctx, newPod("q", withClaim("data", "c1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the new pod gets the new volume", func() bool {
		_, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h2"), Pod: "uid-q"})
		return ok
	})
	// The running pod is resolved again with each change of its claim.
	eventually(ctx, t, "settled", s.pop.Settled)
	if _, ok := s.store.PodVolume(old); !ok {
		t.Error("the running pod lost its volume h1 when its claim was bound to another volume")
	}
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h2"), Pod: "uid-p"}); ok {
		t.Error("the running pod was given h2 as well")
	}
	if errs := s.store.PodErrors("uid-p"); len(errs) != 0 {
		t.Errorf("errors = %v, want none", errs)
	}
}

// TestPodFollowsItsClaimUntilItsVolumeIsPublished: a merge finding (the
// test above failed once in a full run): a new pod resolved from a cache
// that had not yet seen its claim recreated got the old volume and then
// kept it "as a running pod", although nothing of it was published. A pod
// keeps a volume its claim no longer names only if that volume is
// published; otherwise it gets the one the claim names now.
func TestPodFollowsItsClaimUntilItsVolumeIsPublished(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(newPod("p", withClaim("data", "c1")), newPod("q", withClaim("data", "c1")),
		newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"),
		newPV("pv2", "c1", "h2", func(pv *corev1.PersistentVolume) { pv.Spec.ClaimRef.UID = "uid-c1-again" }))
	// Both pods resolve to h1; only p's is published.
	s := startStack(ctx, t, client, stackOptions{published: publishedPods{"uid-p"}})
	for _, pod := range []types.UID{"uid-p", "uid-q"} {
		if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: pod}); !ok {
			t.Fatalf("%s: h1 is not desired at start", pod)
		}
	}
	core := client.CoreV1()
	if err := core.PersistentVolumeClaims(ns).Delete(ctx, "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := newPVC("c1", "pv2")
	again.UID, again.ResourceVersion = "uid-c1-again", "3"
	if _, err := core.PersistentVolumeClaims(ns).Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "q gets h2, which its claim names now", func() bool {
		_, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h2"), Pod: "uid-q"})
		return ok
	})
	eventually(ctx, t, "settled", s.pop.Settled)
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-q"}); ok {
		t.Error("q still wants h1, which it never had published and its claim no longer names")
	}
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"}); !ok {
		t.Error("p lost its published volume h1")
	}
}

// TestHasSyncedWaitsForReferencedObjects: the populator is not synced while
// a pod known at start waits for a referenced object's cache.
func TestHasSyncedWaitsForReferencedObjects(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(newPod("p", withClaim("data", "c1")), newPod("q"), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"))
	var blocked atomic.Bool
	blocked.Store(true)
	unavailable := func(k8stesting.Action) (bool, runtime.Object, error) {
		if blocked.Load() {
			return true, nil, errors.New("injected: API server unavailable")
		}
		return false, nil, nil
	}
	// A by-name watch reads its object with a GET first, then LISTs.
	client.PrependReactor("get", "persistentvolumeclaims", unavailable)
	client.PrependReactor("list", "persistentvolumeclaims", unavailable)
	s := startStack(ctx, t, client, stackOptions{noWait: true})

	eventually(ctx, t, "q resolved", func() bool { return s.store.HasPod("uid-q") })
	if s.pop.HasSynced() {
		t.Fatal("HasSynced while p's claim cannot be listed")
	}
	if s.store.HasPod("uid-p") {
		t.Error("p entered the desired state without its claim")
	}
	blocked.Store(false) // the reflector retries with backoff
	select {
	case <-s.pop.Synced():
	case <-time.After(eventTimeout):
		t.Fatal("not synced after the claim became readable")
	}
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"}); !ok {
		t.Error("synced, but p's volume is not desired")
	}
}

// TestNotSettledWhileANewPodWaitsForItsClaim is the chaos run's first
// finding (seed 20261126): after an API server outage the agent's relist
// brought the deletion of a pod and the creation of another pod of the same
// volume at once; the new pod waited for its claim to be cached, the volume
// looked unwanted meanwhile, and the reconciler unstaged it under the new
// pod. The populator is not Settled while a pod event is not resolved into
// the desired state, and the reconciler does not unstage until it is.
func TestNotSettledWhileANewPodWaitsForItsClaim(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(newPod("old", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"))
	// The reactors go in before the stack runs (the fake client's reactor
	// chain is not safe to change while it is used) and block later.
	var blocked atomic.Bool
	unavailable := func(k8stesting.Action) (bool, runtime.Object, error) {
		if blocked.Load() {
			return true, nil, errors.New("injected: API server unavailable")
		}
		return false, nil, nil
	}
	// The new pod's claim is a new by-name watch: a GET, then a LIST.
	client.PrependReactor("get", "persistentvolumeclaims", unavailable)
	client.PrependReactor("list", "persistentvolumeclaims", unavailable)
	s := startStack(ctx, t, client, stackOptions{})
	eventually(ctx, t, "settled at start", s.pop.Settled)
	blocked.Store(true)
	// Another claim and PV of the same volume (handle h1).
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, newPV("pv2", "c2", "h1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, newPVC("c2", "pv2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, newPod("new", withClaim("data", "c2")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the old pod gone from the desired state", func() bool { return !s.store.HasPod("uid-old") })
	if s.pop.Settled() {
		t.Fatal("Settled while the new pod waits for its claim: the volume would be unstaged under it")
	}
	blocked.Store(false)
	eventually(ctx, t, "settled once the new pod is resolved", s.pop.Settled)
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-new"}); !ok {
		t.Error("settled, but the new pod's volume is not desired")
	}
}

// TestNotSettledWhileACachedPodIsNotDelivered is a chaos run's finding
// (seed 17016): after an API server outage the pod informer relisted;
// client-go replaces its cache first and then tells the handlers the
// deletions before the additions, so the deletion of an old pod of a
// volume was resolved while the new pod of the volume, already in the
// cache, had not been delivered: the populator said Settled and the volume
// was unstaged under the new pod. A pod in the cache whose event has not
// reached the populator keeps it unsettled.
func TestNotSettledWhileACachedPodIsNotDelivered(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(newPod("old", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"))
	held := &heldPods{}
	s := startStack(ctx, t, client, stackOptions{wrapSource: func(src populator.Source) populator.Source {
		held.Source = src
		return held
	}})
	eventually(ctx, t, "settled at start", s.pop.Settled)

	// The new pod is in the cache; its event is held back.
	held.hold("uid-new")
	if _, err := client.CoreV1().Pods(ns).Create(ctx, newPod("new", withClaim("data", "c1")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the new pod cached", func() bool { _, ok := held.Pod("uid-new"); return ok })
	if err := client.CoreV1().Pods(ns).Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the old pod gone from the desired state", func() bool { return !s.store.HasPod("uid-old") })
	if s.pop.Settled() {
		t.Fatal("Settled while the cache has a pod whose event has not arrived: its volume would be unstaged under it")
	}
	held.release("uid-new")
	eventually(ctx, t, "settled once the new pod is delivered and resolved", s.pop.Settled)
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-new"}); !ok {
		t.Error("settled, but the new pod's volume is not desired")
	}
}

// TestSettledWhileAPodIsMarkedForDeletion: a merge finding: a pod marked
// for deletion (its containers still running, the runtime not done) kept
// its event unresolved, so no volume of the node could be unstaged until
// the pod was gone. Keeping its volumes as they are resolves its event.
func TestSettledWhileAPodIsMarkedForDeletion(t *testing.T) {
	ctx := testContext(t)
	client := fakeClient(newPod("p", withClaim("data", "c1")), newPVC("c1", "pv1"), newPV("pv1", "c1", "h1"))
	s := startStack(ctx, t, client, stackOptions{})
	eventually(ctx, t, "settled at start", s.pop.Settled)
	deleting := newPod("p", withClaim("data", "c1"))
	deleting.ResourceVersion = "2"
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if _, err := client.CoreV1().Pods(ns).Update(ctx, deleting, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "the cache sees the pod marked for deletion", func() bool {
		pod, ok := s.src.Pod("uid-p")
		return ok && pod.DeletionTimestamp != nil
	})
	eventually(ctx, t, "settled while the pod is marked for deletion", s.pop.Settled)
	if _, ok := s.store.PodVolume(volume.PodKey{Volume: pvName("h1"), Pod: "uid-p"}); !ok {
		t.Error("the pod marked for deletion lost its volume")
	}
}

// heldPods is a Source that holds back the events of chosen pods, as an
// informer's handler lags behind its cache.
type heldPods struct {
	populator.Source
	mu      sync.Mutex
	held    map[types.UID]bool
	handler func(types.UID)
}

func (h *heldPods) OnPodChange(fn func(types.UID)) {
	h.mu.Lock()
	h.handler = fn
	h.mu.Unlock()
	h.Source.OnPodChange(func(uid types.UID) {
		h.mu.Lock()
		held := h.held[uid]
		h.mu.Unlock()
		if !held {
			fn(uid)
		}
	})
}

func (h *heldPods) hold(uid types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = map[types.UID]bool{}
	}
	h.held[uid] = true
}

func (h *heldPods) release(uid types.UID) {
	h.mu.Lock()
	delete(h.held, uid)
	fn := h.handler
	h.mu.Unlock()
	fn(uid)
}

// TestPolicyChange: a CSIDriver that enables inline volumes re-resolves
// the pods.
func TestPolicyChange(t *testing.T) {
	ctx := testContext(t)
	pod := newPod("p", withVolume(corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{
		CSI: &corev1.CSIVolumeSource{Driver: driver}}}), mount("cache"))
	client := fakeClient(pod)
	s := startStack(ctx, t, client, stackOptions{})
	if errs := s.store.PodErrors("uid-p"); len(errs) != 1 {
		t.Fatalf("errors without a CSIDriver = %v, want Ephemeral not supported", errs)
	}
	if _, err := client.StorageV1().CSIDrivers().Create(ctx,
		csiDriver(driver, false, storagev1.VolumeLifecycleEphemeral), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "inline volume desired", func() bool {
		_, ok := s.store.PodVolume(volume.PodKey{Volume: volume.InlineName("uid-p", "cache"), Pod: "uid-p"})
		return ok && len(s.store.PodErrors("uid-p")) == 0
	})
}

// TestFirstSeenAndRecreatedPod: FirstSeen is the time of the pod's first
// event; a pod re-created under the same name is a new pod.
func TestFirstSeenAndRecreatedPod(t *testing.T) {
	ctx := testContext(t)
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(start)
	client := fakeClient()
	s := startStack(ctx, t, client, stackOptions{clock: clk})
	pods := client.CoreV1().Pods(ns)
	if _, err := pods.Create(ctx, newPod("p"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "p known", func() bool { return s.store.HasPod("uid-p") })
	clk.SetTime(start.Add(time.Hour))
	again := newPod("p")
	again.ResourceVersion = "2"
	again.Labels = map[string]string{"touched": "yes"}
	if _, err := pods.Update(ctx, again, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.store.Pod("uid-p"); !p.FirstSeen.Equal(start) {
		t.Errorf("FirstSeen = %v, want %v (the first event)", p.FirstSeen, start)
	}

	// Same name, new UID, and the deletion was never seen.
	recreated := newPod("p")
	recreated.UID = "uid-p2"
	recreated.ResourceVersion = "3"
	if _, err := pods.Update(ctx, recreated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, "old UID gone, new UID known", func() bool {
		return !s.store.HasPod("uid-p") && s.store.HasPod("uid-p2")
	})
	if got := s.store.Pods(); len(got) != 1 || got[0] != types.UID("uid-p2") {
		t.Errorf("known pods = %v, want [uid-p2]", got)
	}
}

// publishedPods is a PublishedVolumes where every volume of the listed pods
// is published, and no other.
type publishedPods []types.UID

func (p publishedPods) Published(key volume.PodKey) bool { return slices.Contains(p, key.Pod) }
