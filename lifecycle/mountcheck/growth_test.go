package mountcheck

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// worldSteps are the reconciler's steps as far as the actual state sees
// them: each one succeeds and records its outcome.
type worldSteps struct {
	world *asw.World
	dir   string
}

func (s worldSteps) path(parts ...string) string {
	return filepath.Join(append([]string{s.dir}, parts...)...)
}

func (s worldSteps) WaitForAttach(context.Context, volume.Name, volume.Source) error { return nil }

func (s worldSteps) Stage(_ context.Context, name volume.Name, src volume.Source, _ *int64) error {
	p := s.path(src.Handle, "globalmount")
	if err := os.MkdirAll(p, 0o750); err != nil {
		return err
	}
	s.world.RecordStage(name, src.ID, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: p})
	return nil
}

func (s worldSteps) Publish(_ context.Context, key volume.PodKey, src volume.Source, _ volume.PodVolume) error {
	p := s.path(src.Handle, string(key.Pod))
	if err := os.MkdirAll(p, 0o750); err != nil {
		return err
	}
	s.world.RecordPublish(key, src.ID, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: p})
	return nil
}

func (s worldSteps) Unpublish(_ context.Context, key volume.PodKey) error {
	if p, ok := s.world.Pod(key); ok {
		if err := os.Remove(p.TargetPath); err != nil {
			return err
		}
	}
	s.world.ForgetPod(key)
	return nil
}

func (s worldSteps) Unstage(_ context.Context, name volume.Name) error {
	if v, ok := s.world.Volume(name); ok {
		if err := os.RemoveAll(filepath.Dir(v.StagingPath)); err != nil {
			return err
		}
	}
	s.world.ForgetVolume(name)
	return nil
}

// racingMounts is the mount table while the reconciler tears pods down:
// probing a path in teardown runs the teardown first, so that the check
// finds a target broken whose use is gone by the time it acts on it.
type racingMounts struct {
	*fakeMounts
	mu       sync.Mutex
	teardown map[string]func()
}

func (r *racingMounts) IsMountPoint(p string) (bool, error) {
	r.mu.Lock()
	fn := r.teardown[p]
	delete(r.teardown, p)
	r.mu.Unlock()
	if fn != nil {
		fn()
	}
	return r.fakeMounts.IsMountPoint(p)
}

func (r *racingMounts) onProbe(p string, fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.teardown[p] = fn
}

// TestMapsDoNotGrowWithPods is issue 23's unbounded growth: 2,000 pods
// each stage, publish and tear down a volume of their own through the
// observed steps, with a check of the driver's mounts now and then, some
// of them probing a target whose pod is torn down meanwhile; at the end
// every map of the checker is back to its size at the start.
func TestMapsDoNotGrowWithPods(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	const driver = "d.example.com"
	world := asw.New(asw.Options{})
	desired := dsw.New()
	mounts := &racingMounts{fakeMounts: &fakeMounts{mounted: map[string]bool{}}, teardown: map[string]func(){}}
	c, err := New(Config{State: world, Desired: desired, Operations: &fakeOps{}, Mounts: mounts,
		Requeue: func(volume.PodKey) {}})
	if err != nil {
		t.Fatal(err)
	}
	steps := c.Observe(worldSteps{world: world, dir: t.TempDir()})
	start := c.mapSizes()

	for i := range 2000 {
		uid := types.UID(fmt.Sprintf("pod-%d", i))
		handle := fmt.Sprintf("vol-%d", i)
		id := volume.ID{Driver: driver, Handle: handle, PVName: "pv-" + handle, AccessType: volume.Filesystem}
		src := volume.Source{ID: id}
		name := volume.PersistentName(driver, handle)
		key := volume.PodKey{Volume: name, Pod: uid}
		desired.SetPod(dsw.Pod{Info: volume.PodInfo{UID: uid, Namespace: "ns", Name: string(uid)},
			Uses: []dsw.Use{{Name: name, Source: src, Volume: volume.PodVolume{SpecName: "v"}}}})
		if err := steps.Stage(ctx, name, src, nil); err != nil {
			t.Fatal(err)
		}
		v, _ := world.Volume(name)
		mounts.set(v.StagingPath, true)
		if err := steps.Publish(ctx, key, src, volume.PodVolume{SpecName: "v"}); err != nil {
			t.Fatal(err)
		}
		p, _ := world.Pod(key)
		mounts.set(p.TargetPath, true)
		tornDown := false
		if i%200 == 0 {
			// The pod is deleted while the check probes its target.
			mounts.onProbe(p.TargetPath, func() {
				tornDown = true
				desired.DeletePod(uid)
				mounts.set(p.TargetPath, false)
				if err := steps.Unpublish(ctx, key); err != nil {
					t.Error(err)
				}
			})
		}
		if i%100 == 0 {
			if err := c.check(ctx, driver); err != nil {
				t.Fatal(err)
			}
		}
		desired.DeletePod(uid)
		if !tornDown {
			if err := steps.Unpublish(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
		if err := steps.Unstage(ctx, name); err != nil {
			t.Fatal(err)
		}
	}

	if end := c.mapSizes(); !maps.Equal(start, end) {
		t.Errorf("after 2,000 pod lifecycles the checker's maps hold %v entries, %v at the start", end, start)
	}
	if names := world.VolumeNames(); len(names) != 0 {
		t.Errorf("the actual state still has %d volumes", len(names))
	}
}
