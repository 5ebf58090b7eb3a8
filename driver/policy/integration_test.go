package policy_test

import (
	"context"
	"slices"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/driver/policy"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) {
	k8stest.Main(m, k8stest.Options{})
}

const eventTimeout = 30 * time.Second

// TestStoreAgainstAPIServer creates, updates and deletes a CSIDriver in a
// real API server and checks Get and OnChange after each step.
func TestStoreAgainstAPIServer(t *testing.T) {
	fx := k8stest.New(t)
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	ctx := klog.NewContext(t.Context(), logger)
	name := fx.NodeName + ".csi.example.com"
	drivers := fx.Client.StorageV1().CSIDrivers()

	factory := informers.NewSharedInformerFactory(fx.Client, 0)
	// The Store's users give it their interpretation of a CSIDriver; the
	// spec itself, with the API server's defaults, is enough here.
	interpret := func(d *storagev1.CSIDriver) storagev1.CSIDriverSpec {
		if d == nil {
			return storagev1.CSIDriverSpec{}
		}
		return *d.Spec.DeepCopy()
	}
	store, err := policy.New(ctx, factory.Storage().V1().CSIDrivers(), interpret,
		func(a, b storagev1.CSIDriverSpec) bool { return equality.Semantic.DeepEqual(a, b) })
	if err != nil {
		t.Fatalf("policy.New() error: %v", err)
	}
	changes := make(chan string, 100)
	store.OnChange(func(driverName string) {
		if driverName == name { // other tests' drivers are not ours
			changes <- driverName
		}
	})
	factory.StartWithContext(ctx)
	t.Cleanup(factory.Shutdown) // runs after ctx is canceled
	if !cache.WaitForNamedCacheSyncWithContext(ctx, store.HasSynced) {
		t.Fatal("policy store did not sync")
	}
	waitChange := func(step string) {
		t.Helper()
		select {
		case <-changes:
		case <-time.After(eventTimeout):
			t.Fatalf("no OnChange for %s within %v after %s", name, eventTimeout, step)
		}
	}

	if got := store.Get(name); got.AttachRequired != nil {
		t.Fatalf("Get() without a CSIDriver = %+v, want the interpretation of no object", got)
	}

	// Create: unset fields are defaulted by the API server.
	created, err := drivers.Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired: ptr.To(false),
			PodInfoOnMount: ptr.To(true),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{
				storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral,
			},
			TokenRequests: []storagev1.TokenRequest{{Audience: "vault", ExpirationSeconds: ptr.To[int64](3600)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating CSIDriver: %v", err)
	}
	t.Cleanup(func() { _ = drivers.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) })
	waitChange("create")
	got := store.Get(name)
	if *got.AttachRequired || !*got.PodInfoOnMount || !slices.Contains(got.VolumeLifecycleModes, storagev1.VolumeLifecycleEphemeral) ||
		*got.FSGroupPolicy != storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy ||
		len(got.TokenRequests) != 1 || got.TokenRequests[0].Audience != "vault" {
		t.Errorf("Get() after create = %+v, want attach not required, pod info, Ephemeral, vault token, default fsGroupPolicy", got)
	}

	// A label-only update, then a spec update: the spec update is reported.
	created.Labels = map[string]string{"owner": "storage"}
	relabelled, err := drivers.Update(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("updating CSIDriver labels: %v", err)
	}
	relabelled.Spec.FSGroupPolicy = ptr.To(storagev1.FileFSGroupPolicy)
	relabelled.Spec.RequiresRepublish = ptr.To(true)
	if _, err := drivers.Update(ctx, relabelled, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating CSIDriver spec: %v", err)
	}
	waitChange("update")
	got = store.Get(name)
	if *got.FSGroupPolicy != storagev1.FileFSGroupPolicy || !*got.RequiresRepublish {
		t.Errorf("Get() after update = %+v, want fsGroupPolicy File and requiresRepublish", got)
	}

	// Delete: back to the defaults.
	if err := drivers.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting CSIDriver: %v", err)
	}
	waitChange("delete")
	if got := store.Get(name); got.AttachRequired != nil {
		t.Errorf("Get() after delete = %+v, want the interpretation of no object", got)
	}
	select {
	case <-changes:
		t.Errorf("more OnChange notifications than policy changes (the label-only update must not notify)")
	default:
	}
}
