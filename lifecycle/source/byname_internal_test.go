package source

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// TestObjectStore drives the store of one by-name watch the way a
// reflector does and counts the change notifications.
func TestObjectStore(t *testing.T) {
	key := cache.ObjectName{Namespace: "ns", Name: "data"}
	claim := func(name, rv string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	}
	notified := 0
	s := newObjectStore(key, func() { notified++ })
	step := func(what string, do func() error, wantNotified int, wantRV string, wantSynced bool) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if notified != wantNotified {
			t.Errorf("%s: %d notifications in total, want %d", what, notified, wantNotified)
		}
		obj, synced := s.get()
		if synced != wantSynced || resourceVersion(obj) != wantRV {
			t.Errorf("%s: stored rv %q synced %v, want %q %v", what, resourceVersion(obj), synced, wantRV, wantSynced)
		}
	}

	step("add before the first list", func() error { return s.Add(claim("data", "1")) }, 0, "1", false)
	step("first list, empty", func() error { return s.Replace(nil, "5") }, 1, "", true)
	step("others are ignored", func() error { return s.Add(claim("other", "6")) }, 1, "", true)
	step("created", func() error { return s.Add(claim("data", "7")) }, 2, "7", true)
	step("resync echo", func() error { return s.Update(claim("data", "7")) }, 2, "7", true)
	step("updated", func() error { return s.Update(claim("data", "8")) }, 3, "8", true)
	step("relist, unchanged", func() error { return s.Replace([]any{claim("other", "9"), claim("data", "8")}, "9") }, 3, "8", true)
	step("deletion of another", func() error { return s.Delete(claim("other", "9")) }, 3, "8", true)
	step("deleted (final state unknown)", func() error {
		return s.Delete(cache.DeletedFinalStateUnknown{Key: "ns/data", Obj: claim("data", "8")})
	}, 4, "", true)
	step("relist, recreated", func() error { return s.Replace([]any{claim("data", "10")}, "10") }, 5, "10", true)

	obj, _ := s.get()
	if m := obj.(*corev1.PersistentVolumeClaim).ManagedFields; m != nil {
		t.Errorf("managedFields kept in the cache: %v", m)
	}
}
