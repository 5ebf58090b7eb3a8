package source_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// requestLog records the requests a client makes to the by-name kinds.
type requestLog struct {
	next http.RoundTripper

	mu sync.Mutex
	// gets counts the GETs of one object, forbidden those answered 403.
	gets, forbidden int
	// others holds every other request (LIST, WATCH, writes).
	others []string
}

func (l *requestLog) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	for i, seg := range segs {
		if !byNameResources[seg] {
			continue
		}
		l.mu.Lock()
		switch {
		case req.Method == http.MethodGet && i == len(segs)-2 && req.URL.Query().Get("watch") == "":
			l.gets++
			if err == nil && resp.StatusCode == http.StatusForbidden {
				l.forbidden++
			}
		default:
			l.others = append(l.others, req.Method+" "+req.URL.RequestURI())
		}
		l.mu.Unlock()
		break
	}
	return resp, err
}

// TestGetOnlyAsNodeUnderTheNodeAuthorizer runs the Source in GET-only mode
// as a node (user system:node:<node>, group system:nodes) against a real
// API server with the Node authorizer and NodeRestriction, as a kubelet
// runs: a pod bound to the node whose claim is bound after the pod was
// created, its volume, and its VolumeAttachment, created and attached after
// the volume waits for it. The Source follows every step with GETs only —
// no LIST, no WATCH, which the authorizer forbids — and none of the
// authorizer's Forbidden answers (the attachment before it exists, the
// graph lagging behind a binding) surfaces as an error.
func TestGetOnlyAsNodeUnderTheNodeAuthorizer(t *testing.T) {
	env, err := k8stest.Start(k8stest.Options{APIServerFlags: map[string][]string{
		"authorization-mode":       {"Node,RBAC"},
		"enable-admission-plugins": {"NodeRestriction"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	fx := env.NewFixture(t)
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
	admin, ns, nodeName := fx.Client, fx.Namespace, fx.NodeName

	cfg, err := env.AddUser("system:node:"+nodeName, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	log := &requestLog{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { log.next = rt; return log }
	asNode, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The authorizer is in force: a node may not list claims, not even by
	// name.
	if _, err := admin.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("admin lists claims: %v", err)
	}
	byName := metav1.ListOptions{FieldSelector: "metadata.name=data"}
	if _, err := asNode.CoreV1().PersistentVolumeClaims(ns).List(ctx, byName); !apierrors.IsForbidden(err) {
		t.Fatalf("the node lists claims by name: %v, want Forbidden", err)
	}
	log.mu.Lock()
	log.others = nil
	log.mu.Unlock()

	claim, err := admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{
			NodeName:   nodeName,
			Containers: []corev1.Container{{Name: "c", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	src, err := source.New(ctx, source.Config{Client: asNode, NodeName: nodeName, SettledObjectResync: 2 * time.Minute, GetOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	podChanged := make(chan types.UID, 100)
	attachChanged := make(chan volume.Name, 100)
	src.OnPodChange(func(uid types.UID) { podChanged <- uid })
	src.OnAttachmentChange(func(v volume.Name) { attachChanged <- v })
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); src.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !cache.WaitForCacheSync(ctx.Done(), src.HasSynced) {
		t.Fatal("source did not sync")
	}
	if _, ok := src.Pod(pod.UID); !ok {
		t.Fatal("the node's pod is not in the pod cache")
	}

	// await polls read until it holds; a read's error other than "not
	// synced" or NotFound (what a missing object reads as) fails the test.
	await := func(what string, read func() (bool, error)) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, eventTimeout, true, func(context.Context) (bool, error) {
			ok, err := read()
			if err != nil && !errors.Is(err, source.ErrNotSynced) && !apierrors.IsNotFound(err) {
				return false, err
			}
			return ok && err == nil, nil
		})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// The populator's part: the pod references its claim.
	claimKey := cache.ObjectName{Namespace: ns, Name: "data"}
	src.AddReferences(pod.UID, source.References{PVCs: []cache.ObjectName{claimKey}})
	await("pending claim read", func() (bool, error) {
		c, err := src.PVC(ns, "data")
		return err == nil && c.Spec.VolumeName == "", err
	})

	// The claim is bound to a new volume (the PV controller's part).
	const driver, handle = "d.example.com", "handle-1"
	pvName := ns + "-pv"
	if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: ns, Name: "data", UID: claim.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().PersistentVolumes().Delete(context.WithoutCancel(ctx), pvName, metav1.DeleteOptions{})
	})
	claim.Spec.VolumeName = pvName
	if claim, err = admin.CoreV1().PersistentVolumeClaims(ns).Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim.Status.Phase = corev1.ClaimBound
	claim.Status.AccessModes = claim.Spec.AccessModes
	claim.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	if _, err = admin.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podChanged, pod.UID, "claim bound")
	await("bound claim read", func() (bool, error) {
		c, err := src.PVC(ns, "data")
		return err == nil && c.Status.Phase == corev1.ClaimBound, err
	})

	// The populator's part: the pod references the volume and waits for
	// its attachment, which the attach/detach controller has not made yet.
	vaName := volume.AttachmentName(handle, driver, nodeName)
	vol := volume.PersistentName(driver, handle)
	src.AddReferences(pod.UID, source.References{PVs: []string{pvName}, Attachments: []source.Attachment{{Name: vaName, Volume: vol}}})
	await("volume read", func() (bool, error) {
		pv, err := src.PV(pvName)
		return err == nil && pv.Spec.ClaimRef != nil, err
	})
	waitFor(t, attachChanged, vol, "first read of the attachment")
	if _, err := src.Attachments().Get(vaName); !apierrors.IsNotFound(err) {
		t.Fatalf("attachment before it exists: %v, want NotFound", err)
	}

	// The attach/detach controller creates it, the external-attacher
	// attaches it.
	va, err := admin.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: vaName},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: nodeName,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.StorageV1().VolumeAttachments().Delete(context.WithoutCancel(ctx), vaName, metav1.DeleteOptions{})
	})
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/x"}}
	if _, err := admin.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	await("attachment attached", func() (bool, error) {
		got, err := src.Attachments().Get(vaName)
		return err == nil && got.Status.Attached && got.Status.AttachmentMetadata["devicePath"] == "/dev/x", err
	})

	requireNoWatches(t, src, "with everything settled")
	if st := src.Stats(); st.Objects[source.KindPersistentVolumeClaim] != 1 || st.Objects[source.KindPersistentVolume] != 1 ||
		st.Objects[source.KindVolumeAttachment] != 1 {
		t.Errorf("cached objects %v, want one of each kind", st.Objects)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.others) > 0 {
		t.Errorf("requests other than GETs of one object: %v", log.others)
	}
	if log.forbidden == 0 {
		t.Error("no GET was Forbidden: the attachment read before its creation should have been")
	}
	t.Logf("%d GETs, %d of them Forbidden", log.gets, log.forbidden)
}
