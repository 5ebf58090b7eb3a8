package republish

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

type republishAll struct{}

func (republishAll) Get(string) volume.Policy {
	p := volume.DefaultPolicy()
	p.RequiresRepublish = true
	return p
}

// publishes counts the publishes; a publish of a use the desired state no
// longer has is refused, as operations do under the pod's lock.
type publishes struct {
	desired *dsw.Store
	n       int
}

func (p *publishes) Publish(_ context.Context, key volume.PodKey, _ volume.Source, _ volume.PodVolume) error {
	if _, ok := p.desired.PodVolume(key); !ok {
		return fmt.Errorf("publish of %s: %w", key, volume.ErrNotWanted)
	}
	p.n++
	return nil
}

// TestMapsDoNotGrowWithPods is issue 23's unbounded growth for the
// republisher: 2,000 pods of a requiresRepublish driver are published,
// republished once (the last one after the pod left, refused), and torn
// down; the republisher's map and queue end as they started.
func TestMapsDoNotGrowWithPods(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	world := asw.New(asw.Options{})
	desired := dsw.New()
	ops := &publishes{desired: desired}
	r, err := New(Config{Desired: desired, Actual: world, Policies: republishAll{}, Operations: ops, Period: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	start := r.mapSizes()
	now := time.Unix(1_000_000, 0)
	for i := range 2000 {
		uid := types.UID(fmt.Sprintf("p%d", i))
		id := volume.ID{Driver: "d.example.com", Handle: fmt.Sprintf("v%d", i), AccessType: volume.Filesystem}
		name := volume.PersistentName(id.Driver, id.Handle)
		key := volume.PodKey{Volume: name, Pod: uid}
		desired.SetPod(dsw.Pod{Info: volume.PodInfo{UID: uid, Namespace: "ns", Name: string(uid)},
			Uses: []dsw.Use{{Name: name, Source: volume.Source{ID: id}, Volume: volume.PodVolume{SpecName: "v"}}}})
		world.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: "/t/" + string(uid)})
		r.enqueueDue(now)
		now = now.Add(time.Minute)
		r.enqueueDue(now)
		if i%2 == 1 {
			desired.DeletePod(uid) // due at its deletion
		}
		for r.queue.Len() > 0 {
			r.processNext(ctx)
		}
		desired.DeletePod(uid)
		world.ForgetVolume(name)
	}
	r.enqueueDue(now)
	if ops.n != 1000 {
		t.Errorf("%d republishes, want 1000: one for each pod still wanted when due", ops.n)
	}
	if end := r.mapSizes(); !maps.Equal(start, end) {
		t.Errorf("after 2,000 pod lifecycles the republisher's maps hold %v entries, %v at the start", end, start)
	}
}
