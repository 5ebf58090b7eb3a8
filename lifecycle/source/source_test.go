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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const (
	node         = "node-a"
	eventTimeout = 30 * time.Second
)

// events collects notifications on channels.
type events struct {
	pods        chan types.UID
	attachments chan volume.Name
}

// start creates a Source, subscribes to it, runs it until the test ends and
// waits until it has synced.
func start(t *testing.T, client kubernetes.Interface, clusterWide bool) (*source.Source, *events) {
	t.Helper()
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	src, err := source.New(ctx, source.Config{Client: client, NodeName: node, ClusterWideInformers: clusterWide})
	if err != nil {
		t.Fatalf("source.New: %v", err)
	}
	ev := &events{
		pods:        make(chan types.UID, 1000),
		attachments: make(chan volume.Name, 1000),
	}
	src.OnPodChange(func(uid types.UID) { ev.pods <- uid })
	src.OnAttachmentChange(func(n volume.Name) { ev.attachments <- n })

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Run(runCtx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done // every reflector and informer has stopped
	})
	if !cache.WaitForCacheSync(ctx.Done(), src.HasSynced) {
		t.Fatal("source did not sync")
	}
	return src, ev
}

// waitFor receives from ch until want arrives.
func waitFor[T comparable](t *testing.T, ch <-chan T, want T, what string) {
	t.Helper()
	deadline := time.After(eventTimeout)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %s notification for %v within %v", what, want, eventTimeout)
		}
	}
}

// drain empties ch and returns what it held.
func drain[T any](ch <-chan T) []T {
	var out []T
	for {
		select {
		case v := <-ch:
			out = append(out, v)
		default:
			return out
		}
	}
}

// eventually polls cond until it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, eventTimeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func pvc(ns, name, rv string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, UID: types.UID("uid-" + name), ResourceVersion: rv}}
}

func pod(name, nodeName string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec:       corev1.PodSpec{NodeName: nodeName},
	}
}

func TestPodsOfTheNodeOnly(t *testing.T) {
	client := fake.NewClientset(pod("mine", node), pod("other", "node-b"))
	src, ev := start(t, client, false)

	if p, ok := src.Pod("uid-mine"); !ok || p.Name != "mine" {
		t.Errorf("Pod(uid-mine) = %v, %v; want the pod", p, ok)
	}
	if _, ok := src.Pod("uid-other"); ok {
		t.Error("Pod(uid-other) found a pod of another node")
	}
	if got := src.Pods(); len(got) != 1 || got[0].Name != "mine" {
		t.Errorf("Pods() = %v, want [mine]", got)
	}
	waitFor(t, ev.pods, "uid-mine", "pod add")

	// An update with the same resourceVersion is a resync echo: dropped.
	drain(ev.pods)
	pods := client.CoreV1().Pods("ns")
	p := pod("mine", node)
	p.Labels = map[string]string{"x": "y"}
	if _, err := pods.Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = p.DeepCopy()
	p.ResourceVersion = "2"
	p.Status.Phase = corev1.PodSucceeded
	if _, err := pods.Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.pods, "uid-mine", "pod update")
	eventually(t, "cache sees the new phase", func() bool {
		p, ok := src.Pod("uid-mine")
		return ok && p.Status.Phase == corev1.PodSucceeded
	})
	if got := drain(ev.pods); len(got) != 0 {
		t.Errorf("extra notifications %v: the echo with resourceVersion 1 must be dropped", got)
	}

	if err := pods.Delete(t.Context(), "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.pods, "uid-mine", "pod delete")
	if _, ok := src.Pod("uid-mine"); ok {
		t.Error("Pod(uid-mine) still found after delete")
	}
}

func TestByNameWatchLifecycle(t *testing.T) {
	// Objects of other pods exist too: they must never be cached.
	var objs []runtime.Object
	for i := range 20 {
		objs = append(objs, pvc("ns", fmt.Sprintf("foreign-%d", i), "1"))
	}
	objs = append(objs, pvc("ns", "data", "1"))
	client := fake.NewClientset(objs...)
	src, ev := start(t, client, false)

	if _, err := src.PVC("ns", "data"); !errors.Is(err, source.ErrNotReferenced) {
		t.Fatalf("PVC(data) before any reference: err = %v, want ErrNotReferenced", err)
	}
	refs := source.References{PVCs: []cache.ObjectName{{Namespace: "ns", Name: "data"}, {Namespace: "ns", Name: "later"}}}
	src.AddReferences("pod-1", refs)
	src.AddReferences("pod-2", source.References{PVCs: refs.PVCs[:1]})
	// Both pods are told when the watch of "data" has listed it.
	waitFor(t, ev.pods, "pod-2", "first list")
	eventually(t, "data synced", func() bool { _, err := src.PVC("ns", "data"); return err == nil })
	got, _ := src.PVC("ns", "data")
	if got.UID != "uid-data" {
		t.Errorf("PVC(data).UID = %q", got.UID)
	}
	eventually(t, "later synced", func() bool {
		_, err := src.PVC("ns", "later")
		return apierrors.IsNotFound(err)
	})
	st := src.Stats()
	if st.Watches[source.KindPersistentVolumeClaim] != 2 || st.Objects[source.KindPersistentVolumeClaim] != 1 {
		t.Errorf("PVC watches/objects = %d/%d, want 2/1 (the 20 foreign claims are not cached)",
			st.Watches[source.KindPersistentVolumeClaim], st.Objects[source.KindPersistentVolumeClaim])
	}

	// Creating the missing claim re-evaluates only its referencing pod.
	drain(ev.pods)
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Create(t.Context(), pvc("ns", "later", "5"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.pods, "pod-1", "claim created")
	eventually(t, "later cached", func() bool { _, err := src.PVC("ns", "later"); return err == nil })
	for _, uid := range drain(ev.pods) {
		if uid == "pod-2" {
			t.Error("pod-2 notified about a claim it does not reference")
		}
	}

	// pod-1 keeps only "data"; "later" loses its last reference.
	src.SetReferences("pod-1", source.References{PVCs: refs.PVCs[:1]})
	if _, err := src.PVC("ns", "later"); !errors.Is(err, source.ErrNotReferenced) {
		t.Errorf("PVC(later) after its last reference went: err = %v, want ErrNotReferenced", err)
	}
	src.SetReferences("pod-1", source.References{})
	if n := src.Stats().Watches[source.KindPersistentVolumeClaim]; n != 1 {
		t.Errorf("PVC watches with pod-2 still referencing data = %d, want 1", n)
	}
	src.SetReferences("pod-2", source.References{})
	if st := src.Stats(); st.Watches[source.KindPersistentVolumeClaim] != 0 || st.Objects[source.KindPersistentVolumeClaim] != 0 {
		t.Errorf("after all references went: PVC watches/objects = %d/%d, want 0/0",
			st.Watches[source.KindPersistentVolumeClaim], st.Objects[source.KindPersistentVolumeClaim])
	}
	if r := src.References("pod-2"); len(r.PVCs) != 0 {
		t.Errorf("References(pod-2) = %+v, want none", r)
	}
}

func TestAttachments(t *testing.T) {
	client := fake.NewClientset()
	src, ev := start(t, client, false)

	vol := volume.PersistentName("d.example.com", "h1")
	va := volume.AttachmentName("h1", "d.example.com", node)
	if _, err := src.Attachments().Get(va); !errors.Is(err, volume.ErrNotAttached) || !errors.Is(err, source.ErrNotReferenced) {
		t.Errorf("Attachments().Get before any reference: err = %v, want ErrNotAttached and ErrNotReferenced", err)
	}
	src.AddReferences("pod-1", source.References{Attachments: []source.Attachment{{Name: va, Volume: vol}}})
	waitFor(t, ev.attachments, vol, "first list of the VolumeAttachment")
	if _, err := src.Attachments().Get(va); !apierrors.IsNotFound(err) {
		t.Errorf("VolumeAttachment before it exists: err = %v, want NotFound", err)
	}
	obj := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: va, ResourceVersion: "1"},
		Status:     storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/x"}},
	}
	if _, err := client.StorageV1().VolumeAttachments().Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.attachments, vol, "VolumeAttachment created")
	got, err := src.VolumeAttachment(va)
	if err != nil || !got.Status.Attached || got.Status.AttachmentMetadata["devicePath"] != "/dev/x" {
		t.Errorf("VolumeAttachment() = %+v, %v", got, err)
	}
	if got := drain(ev.pods); len(got) != 0 {
		t.Errorf("VolumeAttachment changes notified pods %v; they go to OnAttachmentChange only", got)
	}
}

func TestClusterWideInformers(t *testing.T) {
	client := fake.NewClientset(pvc("ns", "data", "1"), pvc("ns", "foreign", "1"))
	src, ev := start(t, client, true)

	// Everything is cached, referenced or not.
	if _, err := src.PVC("ns", "foreign"); err != nil {
		t.Errorf("PVC(foreign) with cluster-wide informers: %v", err)
	}
	if n := src.Stats().Objects[source.KindPersistentVolumeClaim]; n != 2 {
		t.Errorf("cached claims = %d, want 2", n)
	}
	src.AddReferences("pod-1", source.References{PVCs: []cache.ObjectName{{Namespace: "ns", Name: "data"}}})
	drain(ev.pods)
	for _, name := range []string{"foreign", "data"} {
		c := pvc("ns", name, "2")
		c.Status.Phase = corev1.ClaimBound
		if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(t.Context(), c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ev.pods, "pod-1", "referenced claim updated")
	if got := drain(ev.pods); len(got) != 0 {
		t.Errorf("extra notifications %v (the unreferenced claim must not notify)", got)
	}
}

func TestSecrets(t *testing.T) {
	client := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "creds"},
		Data:       map[string][]byte{"user": []byte("admin"), "password": []byte("s3cret")},
	})
	secrets := source.NewSecrets(client)
	got, err := secrets.GetSecret(t.Context(), "ns", "creds")
	if err != nil || len(got) != 2 || got["user"] != "admin" || got["password"] != "s3cret" {
		t.Errorf("GetSecret(creds) = %v, %v", got, err)
	}
	_, err = secrets.GetSecret(t.Context(), "ns", "missing")
	if !apierrors.IsNotFound(err) {
		t.Errorf("GetSecret(missing): err = %v, want NotFound", err)
	}
	if _, err := secrets.GetSecret(t.Context(), "", "creds"); !errors.Is(err, volume.ErrInvalidSpec) {
		t.Errorf("GetSecret(no namespace): err = %v, want ErrInvalidSpec", err)
	}
	// Secrets are read live: the Source caches none.
	for _, a := range client.Actions() {
		if a.GetVerb() != "get" {
			t.Errorf("unexpected API call %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if n := len(client.Actions()); n != 2 {
		t.Errorf("API calls = %d, want 2 GETs (creds, missing)", n)
	}
}

// TestConcurrentReferences changes references from many goroutines while
// events arrive; run with -race.
func TestConcurrentReferences(t *testing.T) {
	var objs []runtime.Object
	for i := range 8 {
		objs = append(objs, pvc("ns", fmt.Sprintf("c%d", i), "1"))
	}
	client := fake.NewClientset(objs...)
	src, _ := start(t, client, false)
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Go(func() {
			uid := types.UID(fmt.Sprintf("pod-%d", p))
			for r := range 20 {
				src.AddReferences(uid, source.References{PVCs: []cache.ObjectName{{Namespace: "ns", Name: fmt.Sprintf("c%d", (p+r)%8)}}})
				_, _ = src.PVC("ns", fmt.Sprintf("c%d", (p+r)%8))
				_ = src.Stats()
				if r%4 == 3 {
					src.SetReferences(uid, source.References{})
				}
			}
		})
	}
	wg.Wait()
	if n := src.Stats().Watches[source.KindPersistentVolumeClaim]; n != 0 {
		t.Errorf("PVC watches after every pod released its references = %d, want 0", n)
	}
}
