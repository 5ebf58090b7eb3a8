package source_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// pollBound is how long GET-only mode may take at most to see a change of
// an object that is not settled: the longest poll interval (8 s) with its
// jitter (10 %), and a second for a loaded machine.
const pollBound = 8800*time.Millisecond + time.Second

// nodeAuthorizer makes a fake clientset answer as the API server's Node
// authorizer answers a node (plugin/pkg/auth/authorizer/node) for the kinds
// the Source reads by name: a GET of an object that does not exist, or that
// the test hides (the authorizer's graph does not relate it to the node
// yet), is Forbidden, never NotFound, and a LIST or a WATCH is Forbidden
// whatever its field selector. Every LIST and WATCH tried fails the test
// when it ends.
type nodeAuthorizer struct {
	tracker k8stesting.ObjectTracker

	// mu protects the fields below.
	mu sync.Mutex
	// hidden holds the "resource/name" of objects the graph does not
	// relate to the node yet.
	hidden map[string]bool
	// gets counts the GETs of each "resource/name".
	gets map[string]int
	// denied holds the LISTs and WATCHes tried.
	denied []string
}

// byNameResources are the resources the Node authorizer lets a node GET,
// one object at a time, and nothing else.
var byNameResources = map[string]bool{"persistentvolumeclaims": true, "persistentvolumes": true, "volumeattachments": true}

func newNodeAuthorizer(t *testing.T, client *fake.Clientset) *nodeAuthorizer {
	t.Helper()
	a := &nodeAuthorizer{tracker: client.Tracker(), hidden: map[string]bool{}, gets: map[string]int{}}
	client.PrependReactor("*", "*", a.react)
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		res := action.GetResource()
		if !byNameResources[res.Resource] {
			return false, nil, nil
		}
		a.deny("watch " + res.Resource)
		return true, nil, forbidden(res.GroupResource(), "", "watch")
	})
	// Registered before the Source starts: runs after it stopped.
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.denied) > 0 {
			t.Errorf("LISTs and WATCHes in GET-only mode, which the Node authorizer forbids: %v", a.denied)
		}
	})
	return a
}

func (a *nodeAuthorizer) react(action k8stesting.Action) (bool, runtime.Object, error) {
	res := action.GetResource()
	if !byNameResources[res.Resource] {
		return false, nil, nil
	}
	switch action.GetVerb() {
	case "get":
		name := action.(k8stesting.GetAction).GetName()
		a.mu.Lock()
		a.gets[res.Resource+"/"+name]++
		hidden := a.hidden[res.Resource+"/"+name]
		a.mu.Unlock()
		if !hidden {
			if _, err := a.tracker.Get(res, action.GetNamespace(), name); !apierrors.IsNotFound(err) {
				return false, nil, nil // the object, as the fake serves it
			}
		}
		return true, nil, forbidden(res.GroupResource(), name, "get")
	case "list":
		a.deny("list " + res.Resource)
		return true, nil, forbidden(res.GroupResource(), "", "list")
	}
	return false, nil, nil // the test's own writes
}

// forbidden is the Node authorizer's answer (through RBAC, which grants
// the node nothing more).
func forbidden(gr schema.GroupResource, name, verb string) error {
	return apierrors.NewForbidden(gr, name,
		fmt.Errorf("User %q cannot %s resource %q: no relationship found between node %q and this object",
			"system:node:"+node, verb, gr.String(), node))
}

func (a *nodeAuthorizer) deny(what string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.denied = append(a.denied, what)
}

func (a *nodeAuthorizer) hide(resource, name string, hidden bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hidden[resource+"/"+name] = hidden
}

func (a *nodeAuthorizer) getsOf(resource, name string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gets[resource+"/"+name]
}

// startGetOnly starts a Source in GET-only mode whose settled objects are
// read again every period.
func startGetOnly(t *testing.T, client *fake.Clientset, period time.Duration) (*source.Source, *events) {
	t.Helper()
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	src, err := source.New(ctx, source.Config{Client: client, NodeName: node, SettledObjectResync: period, GetOnly: true})
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

// requireNoWatches fails t when the Source says it holds a watch of a
// referenced kind.
func requireNoWatches(t *testing.T, src *source.Source, when string) {
	t.Helper()
	st := src.Stats()
	for _, kind := range []source.Kind{source.KindPersistentVolumeClaim, source.KindPersistentVolume, source.KindVolumeAttachment} {
		if n := st.Watches[kind]; n != 0 {
			t.Errorf("%s: %d watches of %s in GET-only mode, want none", when, n, kind)
		}
	}
}

// TestGetOnlyConfig: GET-only mode has no watch to fall back on, so it
// needs settled objects to be read again, and it excludes cluster-wide
// informers.
func TestGetOnlyConfig(t *testing.T) {
	client := fake.NewClientset()
	for name, cfg := range map[string]source.Config{
		"no settled re-read":     {Client: client, NodeName: node, GetOnly: true},
		"cluster-wide informers": {Client: client, NodeName: node, GetOnly: true, SettledObjectResync: time.Minute, ClusterWideInformers: true},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: Validate() accepted GetOnly", name)
		}
	}
	if err := (source.Config{Client: client, NodeName: node, GetOnly: true, SettledObjectResync: time.Minute}).Validate(); err != nil {
		t.Errorf("Validate(): %v", err)
	}
}

// TestGetOnlyFirstReadsOfABurstAreGets: the first reads of a burst of
// references — a namespace's every claim, which outside GET-only mode one
// LIST answers — are one GET each, and nothing is watched.
func TestGetOnlyFirstReadsOfABurstAreGets(t *testing.T) {
	var objs []runtime.Object
	var keys []cache.ObjectName
	for i := range 100 {
		c := boundPVC("1", corev1.ClaimBound)
		c.Name = fmt.Sprintf("c-%03d", i)
		objs = append(objs, c)
		keys = append(keys, cache.ObjectName{Namespace: "ns", Name: c.Name})
	}
	client := fake.NewClientset(objs...)
	auth := newNodeAuthorizer(t, client)
	src, _ := startGetOnly(t, client, time.Hour)
	src.AddReferences("pod-1", source.References{PVCs: keys})
	eventually(t, "every claim cached", func() bool {
		for _, k := range keys {
			if _, err := src.PVC(k.Namespace, k.Name); err != nil {
				return false
			}
		}
		return true
	})
	for _, k := range keys {
		if n := auth.getsOf("persistentvolumeclaims", k.Name); n != 1 {
			t.Errorf("claim %s read with %d GETs, want 1 (bound: settled at its first read)", k.Name, n)
		}
	}
	requireNoWatches(t, src, "after the burst")
}

// TestGetOnlyAttachmentPolledUntilAttached: a VolumeAttachment that is not
// attached is polled with GETs backing off from 500 ms to 8 s, not
// watched; its attachment is noticed within the longest interval, and the
// volume waiting for it is told as a watch event would tell it. Attached,
// it settles and is no longer polled.
func TestGetOnlyAttachmentPolledUntilAttached(t *testing.T) {
	t.Parallel()
	vol := volume.PersistentName("d.example.com", "h1")
	name := volume.AttachmentName("h1", "d.example.com", node)
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"}}
	client := fake.NewClientset(va)
	auth := newNodeAuthorizer(t, client)
	src, ev := startGetOnly(t, client, time.Hour)
	src.AddReferences("pod-1", source.References{Attachments: []source.Attachment{{Name: name, Volume: vol}}})
	waitFor(t, ev.attachments, vol, "first read of the VolumeAttachment")
	firstRead := time.Now()
	if got, err := src.VolumeAttachment(name); err != nil || got.Status.Attached {
		t.Fatalf("VolumeAttachment() = %+v, %v; want it, not attached", got, err)
	}
	requireNoWatches(t, src, "while the attachment is polled")

	// Polled 0.5, 1, 2 and 4 s apart (each up to 10 % later): from the
	// fifth GET on, the interval is the longest.
	eventually(t, "the poll backed off to its longest interval", func() bool { return auth.getsOf("volumeattachments", name) >= 5 })
	if took := time.Since(firstRead); took < 7*time.Second {
		t.Errorf("four polls after %v, want 7.5 s or more: the interval doubles from 500 ms", took)
	}
	drain(ev.attachments)
	attached := va.DeepCopy()
	attached.ResourceVersion = "2"
	attached.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/x"}}
	if _, err := client.StorageV1().VolumeAttachments().Update(t.Context(), attached, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	select {
	case got := <-ev.attachments:
		if got != vol {
			t.Errorf("attachment change reported for %q, want %q", got, vol)
		}
		t.Logf("attachment noticed after %v", time.Since(began))
	case <-time.After(pollBound):
		t.Fatalf("attachment not noticed within %v", pollBound)
	}
	if got, err := src.Attachments().Get(name); err != nil || !got.Status.Attached || got.Status.AttachmentMetadata["devicePath"] != "/dev/x" {
		t.Errorf("Attachments().Get() = %+v, %v; want it attached", got, err)
	}

	// Attached, it settled: read again an hour later, not polled.
	gets := auth.getsOf("volumeattachments", name)
	time.Sleep(2 * time.Second)
	if n := auth.getsOf("volumeattachments", name) - gets; n != 0 {
		t.Errorf("%d GETs of the settled attachment within 2 s, want none", n)
	}
	requireNoWatches(t, src, "once attached")
}

// TestGetOnlyForbiddenAttachmentIsMissing: the Node authorizer forbids a
// VolumeAttachment the attach/detach controller has not created yet (it
// cannot tell it from one of another node): it reads as missing, not as
// unreadable, and its creation is noticed by the poll.
func TestGetOnlyForbiddenAttachmentIsMissing(t *testing.T) {
	t.Parallel()
	vol := volume.PersistentName("d.example.com", "h2")
	name := volume.AttachmentName("h2", "d.example.com", node)
	client := fake.NewClientset()
	auth := newNodeAuthorizer(t, client)
	src, ev := startGetOnly(t, client, time.Hour)
	src.AddReferences("pod-1", source.References{Attachments: []source.Attachment{{Name: name, Volume: vol}}})
	waitFor(t, ev.attachments, vol, "first read of the VolumeAttachment")
	check := func(when string) {
		t.Helper()
		_, err := src.Attachments().Get(name)
		if !apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			t.Errorf("%s: Attachments().Get() error %v, want NotFound", when, err)
		}
	}
	check("after the first GET")
	eventually(t, "the missing attachment polled", func() bool { return auth.getsOf("volumeattachments", name) >= 3 })
	check("after three GETs")

	drain(ev.attachments)
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "5"},
		Status: storagev1.VolumeAttachmentStatus{Attached: true}}
	if _, err := client.StorageV1().VolumeAttachments().Create(t.Context(), va, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ev.attachments:
	case <-time.After(pollBound):
		t.Fatalf("creation of the attachment not noticed within %v", pollBound)
	}
	if got, err := src.VolumeAttachment(name); err != nil || !got.Status.Attached {
		t.Errorf("VolumeAttachment() = %+v, %v; want it attached", got, err)
	}
	requireNoWatches(t, src, "at the end")
}

// TestGetOnlyVolumeForbiddenWhileTheGraphLags: right after a claim was
// bound the Node authorizer's graph may not relate the volume to the node
// yet, and forbids it: the volume reads as not synced yet, not as
// unreadable, until a poll reads it, and its pods are told then.
func TestGetOnlyVolumeForbiddenWhileTheGraphLags(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(boundPVC("1", corev1.ClaimBound), boundPV("1", "1Gi"))
	auth := newNodeAuthorizer(t, client)
	auth.hide("persistentvolumes", "pv-data", true)
	src, ev := startGetOnly(t, client, time.Hour)
	src.AddReferences("pod-1", source.References{
		PVCs: []cache.ObjectName{{Namespace: "ns", Name: "data"}}, PVs: []string{"pv-data"}})
	eventually(t, "claim cached", func() bool { _, err := src.PVC("ns", "data"); return err == nil })
	// Forbidden for about 2 s (four GETs): never unreadable meanwhile.
	for auth.getsOf("persistentvolumes", "pv-data") < 4 {
		if _, err := src.PV("pv-data"); !errors.Is(err, source.ErrNotSynced) {
			t.Fatalf("PV() while the authorizer forbids it: %v, want ErrNotSynced", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	drain(ev.pods)
	auth.hide("persistentvolumes", "pv-data", false)
	waitFor(t, ev.pods, "pod-1", "volume readable")
	if pv, err := src.PV("pv-data"); err != nil || pv.Spec.ClaimRef == nil {
		t.Errorf("PV() once readable = %+v, %v", pv, err)
	}
	requireNoWatches(t, src, "at the end")
}

// TestGetOnlySettledObjectsChange: GET-only mode keeps the settle rule: a
// bound claim and volume are read again every period (a change seen, the
// pod told); a claim that is no longer bound is polled until it is bound
// again; nothing is ever watched or listed.
func TestGetOnlySettledObjectsChange(t *testing.T) {
	client := fake.NewClientset(boundPVC("1", corev1.ClaimBound), boundPV("1", "1Gi"))
	newNodeAuthorizer(t, client)
	src, ev := startGetOnly(t, client, settleResync)
	src.AddReferences("pod-1", source.References{
		PVCs: []cache.ObjectName{{Namespace: "ns", Name: "data"}}, PVs: []string{"pv-data"}})
	eventually(t, "claim and volume cached", func() bool {
		_, e1 := src.PVC("ns", "data")
		_, e2 := src.PV("pv-data")
		return e1 == nil && e2 == nil
	})
	drain(ev.pods)
	if _, err := client.CoreV1().PersistentVolumes().Update(t.Context(), boundPV("2", "2Gi"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.pods, "pod-1", "volume expanded")

	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(t.Context(), boundPVC("3", corev1.ClaimPending), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pending claim read", func() bool {
		c, err := src.PVC("ns", "data")
		return err == nil && c.Status.Phase == corev1.ClaimPending
	})
	requireNoWatches(t, src, "with the claim pending")
	drain(ev.pods)
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(t.Context(), boundPVC("4", corev1.ClaimBound), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.pods, "pod-1", "claim bound")
	if st := src.Stats(); st.Objects[source.KindPersistentVolumeClaim] != 1 || st.Objects[source.KindPersistentVolume] != 1 {
		t.Errorf("cached: PVC %d, PV %d; want 1 and 1", st.Objects[source.KindPersistentVolumeClaim], st.Objects[source.KindPersistentVolume])
	}
	requireNoWatches(t, src, "at the end")
}
