package policy

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

// eventTimeout bounds how long a test waits for an informer event that must
// arrive; it is a deadline, not a delay.
const eventTimeout = 30 * time.Second

// testPolicy is the interpretation the tests give the Store: a few fields
// of the CSIDriver spec, with the kubelet's defaults for a missing object.
type testPolicy struct {
	AttachRequired, PodInfoOnMount, RequiresRepublish, SELinuxMount bool
	FSGroupPolicy                                                   storagev1.FSGroupPolicy
	Persistent, Ephemeral                                           bool
	Audience                                                        string
}

func interpret(d *storagev1.CSIDriver) testPolicy {
	p := testPolicy{AttachRequired: true, FSGroupPolicy: storagev1.ReadWriteOnceWithFSTypeFSGroupPolicy, Persistent: true}
	if d == nil {
		return p
	}
	if v := d.Spec.AttachRequired; v != nil {
		p.AttachRequired = *v
	}
	if v := d.Spec.PodInfoOnMount; v != nil {
		p.PodInfoOnMount = *v
	}
	if v := d.Spec.RequiresRepublish; v != nil {
		p.RequiresRepublish = *v
	}
	if v := d.Spec.SELinuxMount; v != nil {
		p.SELinuxMount = *v
	}
	if v := d.Spec.FSGroupPolicy; v != nil && *v != "" {
		p.FSGroupPolicy = *v
	}
	if modes := d.Spec.VolumeLifecycleModes; len(modes) > 0 {
		p.Persistent = slices.Contains(modes, storagev1.VolumeLifecyclePersistent)
		p.Ephemeral = slices.Contains(modes, storagev1.VolumeLifecycleEphemeral)
	}
	if len(d.Spec.TokenRequests) > 0 {
		p.Audience = d.Spec.TokenRequests[0].Audience
	}
	return p
}

func equal(a, b testPolicy) bool { return a == b }

func newStore(ctx context.Context, t *testing.T, factory informers.SharedInformerFactory) *Store[testPolicy] {
	t.Helper()
	store, err := New(ctx, factory.Storage().V1().CSIDrivers(), interpret, equal)
	if err != nil {
		t.Fatalf("New() error: %v", err)
	}
	return store
}

func csiDriver(name string, mutate func(*storagev1.CSIDriverSpec)) *storagev1.CSIDriver {
	d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"}}
	if mutate != nil {
		mutate(&d.Spec)
	}
	return d
}

// subscribe registers a subscriber on s that forwards driver names to the
// returned channel.
func subscribe(s *Store[testPolicy]) <-chan string {
	ch := make(chan string, 100)
	s.OnChange(func(driverName string) { ch <- driverName })
	return ch
}

func waitChange(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case name := <-ch:
		return name
	case <-time.After(eventTimeout):
		t.Fatalf("no OnChange notification within %v", eventTimeout)
		return ""
	}
}

func assertNoPendingChange(t *testing.T, ch <-chan string) {
	t.Helper()
	select {
	case name := <-ch:
		t.Fatalf("unexpected OnChange notification for driver %q", name)
	default:
	}
}

// startAndSync starts factory, stops it when t ends and waits until store
// has synced.
func startAndSync(ctx context.Context, t *testing.T, factory informers.SharedInformerFactory, store *Store[testPolicy]) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(func() {
		cancel() // Shutdown waits for the informers, which stop when ctx ends.
		factory.Shutdown()
	})
	factory.StartWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), store.HasSynced) {
		t.Fatal("store did not sync")
	}
}

func TestStoreWithInformer(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(
		csiDriver("seeded.csi.example.com", func(s *storagev1.CSIDriverSpec) { s.AttachRequired = ptr.To(false) }),
		csiDriver("plain.csi.example.com", nil),
	)
	factory := informers.NewSharedInformerFactory(client, 0)
	store := newStore(ctx, t, factory)
	changes := subscribe(store)
	if store.HasSynced() {
		t.Fatal("HasSynced() = true before the informer started")
	}

	startAndSync(ctx, t, factory, store)

	// Only the object whose policy differs from the defaults is reported.
	if got := waitChange(t, changes); got != "seeded.csi.example.com" {
		t.Errorf("initial OnChange for %q, want seeded.csi.example.com", got)
	}
	assertNoPendingChange(t, changes)

	if got := store.Get("seeded.csi.example.com"); got.AttachRequired {
		t.Errorf("Get(seeded).AttachRequired = true, want false from the CSIDriver object")
	}
	if diff := cmp.Diff(interpret(nil), store.Get("plain.csi.example.com")); diff != "" {
		t.Errorf("Get(plain) is not the default policy (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(interpret(nil), store.Get("absent.csi.example.com")); diff != "" {
		t.Errorf("Get(absent) is not the default policy (-want +got):\n%s", diff)
	}

	drivers := client.StorageV1().CSIDrivers()

	// Create.
	created := csiDriver("new.csi.example.com", func(s *storagev1.CSIDriverSpec) {
		s.PodInfoOnMount = ptr.To(true)
		s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecycleEphemeral}
	})
	if _, err := drivers.Create(ctx, created, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating CSIDriver: %v", err)
	}
	if got := waitChange(t, changes); got != "new.csi.example.com" {
		t.Fatalf("OnChange for %q after create, want new.csi.example.com", got)
	}
	p := store.Get("new.csi.example.com")
	if !p.PodInfoOnMount || !p.Ephemeral || p.Persistent {
		t.Errorf("Get(new) = %+v, want podInfoOnMount and Ephemeral only", p)
	}

	// A metadata-only update is not reported: the next notification is for
	// the policy change that follows it.
	relabelled := created.DeepCopy()
	relabelled.Labels = map[string]string{"team": "storage"}
	relabelled.ResourceVersion = "2"
	if _, err := drivers.Update(ctx, relabelled, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating CSIDriver labels: %v", err)
	}
	changed, err := drivers.Get(ctx, "plain.csi.example.com", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting CSIDriver: %v", err)
	}
	changed = changed.DeepCopy()
	changed.ResourceVersion = "2"
	changed.Spec.FSGroupPolicy = ptr.To(storagev1.NoneFSGroupPolicy)
	if _, err := drivers.Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating CSIDriver spec: %v", err)
	}
	if got := waitChange(t, changes); got != "plain.csi.example.com" {
		t.Fatalf("OnChange for %q, want plain.csi.example.com (label-only update must not notify)", got)
	}
	if got := store.Get("plain.csi.example.com").FSGroupPolicy; got != storagev1.NoneFSGroupPolicy {
		t.Errorf("Get(plain).FSGroupPolicy = %q after update, want None", got)
	}

	// Delete.
	if err := drivers.Delete(ctx, "seeded.csi.example.com", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting CSIDriver: %v", err)
	}
	if got := waitChange(t, changes); got != "seeded.csi.example.com" {
		t.Fatalf("OnChange for %q after delete, want seeded.csi.example.com", got)
	}
	if got := store.Get("seeded.csi.example.com"); !got.AttachRequired {
		t.Errorf("Get(seeded).AttachRequired = false after delete, want the default true")
	}
}

// TestStoreEventHandlers drives the handlers directly, as sample-controller's
// tests do, to cover events that a fake informer cannot produce on demand.
func TestStoreEventHandlers(t *testing.T) {
	custom := csiDriver("custom.csi.example.com", func(s *storagev1.CSIDriverSpec) { s.RequiresRepublish = ptr.To(true) })
	plain := csiDriver("plain.csi.example.com", nil)
	customChanged := custom.DeepCopy()
	customChanged.ResourceVersion = "2"
	customChanged.Spec.SELinuxMount = ptr.To(true)

	tests := map[string]struct {
		event func(s *Store[testPolicy])
		want  []string
	}{
		"add with defaults only": {
			event: func(s *Store[testPolicy]) { s.onAdd(plain) },
		},
		"add with custom policy": {
			event: func(s *Store[testPolicy]) { s.onAdd(custom) },
			want:  []string{"custom.csi.example.com"},
		},
		"resync echo with the same resourceVersion": {
			event: func(s *Store[testPolicy]) { s.onUpdate(custom, custom.DeepCopy()) },
		},
		"update changing the policy": {
			event: func(s *Store[testPolicy]) { s.onUpdate(custom, customChanged) },
			want:  []string{"custom.csi.example.com"},
		},
		"delete": {
			event: func(s *Store[testPolicy]) { s.onDelete(custom) },
			want:  []string{"custom.csi.example.com"},
		},
		"delete through a tombstone": {
			event: func(s *Store[testPolicy]) {
				s.onDelete(cache.DeletedFinalStateUnknown{Key: custom.Name, Obj: custom})
			},
			want: []string{"custom.csi.example.com"},
		},
		"delete of a default object": {
			event: func(s *Store[testPolicy]) { s.onDelete(cache.DeletedFinalStateUnknown{Key: plain.Name, Obj: plain}) },
		},
		"unexpected object types are ignored": {
			event: func(s *Store[testPolicy]) {
				s.onAdd("not a CSIDriver")
				s.onUpdate(custom, 42)
				s.onDelete(cache.DeletedFinalStateUnknown{Key: "x", Obj: "not a CSIDriver"})
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			factory := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
			store := newStore(ctx, t, factory)
			var got, got2 []string
			store.OnChange(func(name string) { got = append(got, name) })
			store.OnChange(func(name string) { got2 = append(got2, name) })

			tc.event(store)

			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("notifications mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(got, got2); diff != "" {
				t.Errorf("second subscriber saw different notifications (-first +second):\n%s", diff)
			}
		})
	}
}
