package mountcheck

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// fakeMounts says which paths are mount points.
type fakeMounts struct {
	mu      sync.Mutex
	mounted map[string]bool
}

func (f *fakeMounts) IsMountPoint(p string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mounted[p], nil
}

func (f *fakeMounts) set(p string, m bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mounted[p] = m
}

type fakeOps struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeOps) Stage(_ context.Context, name volume.Name, _ volume.Source, _ *int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "stage "+string(name))
	return nil
}

func (f *fakeOps) MarkMountUncertain(_ context.Context, key volume.PodKey, _ volume.Step, _ error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "uncertain "+key.String())
	return nil
}

// TestCheckRepairsOnlyBrokenPaths: of three published uses of one driver,
// a healthy one gets nothing, a missing target and a target that is no
// longer a mount point are marked for publishing again; a staging path that
// was never a mount point (a driver that does not mount at stage) is left
// alone, one that was and is no more is staged again first.
func TestCheckRepairsOnlyBrokenPaths(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const driver = "d.example.com"
	world := asw.New(asw.Options{})
	desired := dsw.New()
	mounts := &fakeMounts{mounted: map[string]bool{}}
	ops := &fakeOps{}
	var requeued []volume.PodKey
	c, err := New(Config{State: world, Desired: desired, Operations: ops, Mounts: mounts,
		Requeue: func(k volume.PodKey) { requeued = append(requeued, k) }})
	if err != nil {
		t.Fatal(err)
	}
	add := func(handle string, staging string, uid types.UID, target string) volume.PodKey {
		id := volume.ID{Driver: driver, Handle: handle, PVName: "pv-" + handle, AccessType: volume.Filesystem}
		name := volume.PersistentName(driver, handle)
		world.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: staging})
		key := volume.PodKey{Volume: name, Pod: uid}
		world.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: target})
		desired.SetPod(dsw.Pod{Info: volume.PodInfo{UID: uid, Namespace: "ns", Name: string(uid)},
			Uses: []dsw.Use{{Name: name, Source: volume.Source{ID: id}, Volume: volume.PodVolume{SpecName: "v"}}}})
		return key
	}
	healthyT, healthyS := mk("healthy/t"), mk("healthy/s")
	mounts.set(healthyT, true)
	mounts.set(healthyS, true)
	healthy := add("healthy", healthyS, "p1", healthyT)
	lostT, neverMountedS := mk("lost/t"), mk("lost/s")
	lost := add("lost", neverMountedS, "p2", lostT)
	goneS := mk("gone/s")
	mounts.set(goneS, true)
	gone := add("gone", goneS, "p3", filepath.Join(dir, "gone/t-missing"))

	// A baseline check: everything as the steps left it.
	c.staged(gone.Volume)
	if err := c.check(ctx, driver); err != nil {
		t.Fatal(err)
	}
	// The lost target is not a mount point: broken at once (a filesystem
	// target must be one); the missing target too.
	if want := []string{"uncertain " + gone.String(), "uncertain " + lost.String()}; !slices.Equal(sorted(ops.calls), sorted(want)) {
		t.Errorf("first check: calls %q, want %q", ops.calls, want)
	}
	ops.calls, requeued = nil, nil
	mounts.set(lostT, true)
	if err := os.MkdirAll(filepath.Join(dir, "gone/t-missing"), 0o750); err != nil {
		t.Fatal(err)
	}
	mounts.set(filepath.Join(dir, "gone/t-missing"), true)
	// Now the gone volume's staging path stops being a mount point.
	mounts.set(goneS, false)
	if err := c.check(ctx, driver); err != nil {
		t.Fatal(err)
	}
	if want := []string{"stage " + string(gone.Volume)}; !slices.Equal(ops.calls, want) {
		t.Errorf("second check: calls %q, want %q (the never-mounted staging path and the healthy use untouched)", ops.calls, want)
	}
	if slices.Contains(requeued, healthy) {
		t.Errorf("the healthy use was requeued")
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
