package front_test

import (
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// backendDelay is how long the plugin holds the call the other side races
// with: long enough that the racing call is surely issued while it runs.
const backendDelay = 2 * time.Second

// reconcilerUse is a pod's use of the volume as the reconciler's steps
// (lifecycle/operations Publish and Unpublish) see it.
func reconcilerUse(driver, handle string) (volume.PodKey, volume.Source, volume.PodVolume) {
	src := volume.Source{
		ID:          volume.ID{Driver: driver, Handle: handle, PVName: "pv-" + handle, AccessType: volume.Filesystem},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
	}
	pv := volume.PodVolume{Pod: volume.PodInfo{UID: "pod-a", Namespace: "ns", Name: "a"}, SpecName: "data"}
	return volume.PodKey{Volume: volume.PersistentName(driver, handle), Pod: "pod-a"}, src, pv
}

// result is the outcome of a call run in the background, and when it
// was issued.
type result struct {
	err    error
	issued time.Time
}

// background runs fn on its own goroutine.
func background(fn func() error) <-chan result {
	ch := make(chan result, 1)
	issued := time.Now()
	go func() { ch <- result{err: fn(), issued: issued} }()
	return ch
}

// only returns the one call of method, failing t if there is not exactly one.
func (e *env) only(t *testing.T, method string) plugin.Call {
	t.Helper()
	calls := e.calls(t, method)
	if len(calls) != 1 {
		t.Fatalf("the plugin saw %d %s calls, want 1: %+v", len(calls), method, calls)
	}
	return calls[0]
}

// A front NodeStageVolume and the reconciler's Publish of the same volume:
// the publish waits for the stage (which holds the volume exclusively),
// then publishes from the staging path the CO chose.
func TestFrontStageAndReconcilerPublishAreSerialized(t *testing.T) {
	e := start(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	handle := e.createVolume(t, "race-stage")
	staging := e.path("staging")
	key, src, pv := reconcilerUse(e.p.Name, handle)

	if err := e.p.SetFaults(plugin.FaultRule{Method: "NodeStageVolume", Delay: backendDelay}); err != nil {
		t.Fatal(err)
	}
	stage := background(func() error {
		_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: staging, VolumeCapability: mountCap()})
		return err
	})
	e.waitForCall(t, "NodeStageVolume")
	publish := background(func() error { return e.stack.Operations.Publish(ctx, key, src, pv) })

	if r := <-stage; r.err != nil {
		t.Fatalf("NodeStageVolume through the front: %v", r.err)
	}
	r := <-publish
	if r.err != nil {
		t.Fatalf("the reconciler's Publish: %v (it ran before the stage it waits for?)", r.err)
	}
	stageCall, publishCall := e.only(t, "NodeStageVolume"), e.only(t, "NodePublishVolume")
	if !r.issued.Before(stageCall.End.Time) {
		t.Fatalf("precondition: Publish was issued at %v, after NodeStageVolume ended at %v; the race did not happen", r.issued, stageCall.End.Time)
	}
	if stageCall.Overlaps(publishCall) || publishCall.Begin.Time.Before(stageCall.End.Time) {
		t.Errorf("NodePublishVolume [%v, %v] overlapped NodeStageVolume [%v, %v]",
			publishCall.Begin.Time, publishCall.End.Time, stageCall.Begin.Time, stageCall.End.Time)
	}
	if publishCall.Begin.StagingPath != staging {
		t.Errorf("the reconciler's publish used staging path %q, want the CO's %q", publishCall.Begin.StagingPath, staging)
	}
	if p, _ := e.stack.World.Pod(key); p.State != volume.Published || p.External {
		t.Errorf("the reconciler's pod entry = %+v, want Published and not External", p)
	}
}

// A front NodeUnstageVolume while the reconciler publishes the volume:
// the unstage waits for the publish, then the unstage rule refuses it (the
// volume is published) without calling the driver. Once the reconciler
// has unpublished (racing again), the unstage goes through, after the
// unpublish, never during it.
func TestFrontUnstageWaitsForReconcilerSteps(t *testing.T) {
	e := start(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	handle := e.createVolume(t, "race-unstage")
	staging := e.path("staging")
	key, src, pv := reconcilerUse(e.p.Name, handle)
	unstageReq := &csi.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: staging}
	if _, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: staging, VolumeCapability: mountCap()}); err != nil {
		t.Fatal(err)
	}

	if err := e.p.SetFaults(plugin.FaultRule{Method: "NodePublishVolume", Delay: backendDelay}); err != nil {
		t.Fatal(err)
	}
	publish := background(func() error { return e.stack.Operations.Publish(ctx, key, src, pv) })
	e.waitForCall(t, "NodePublishVolume")
	unstage := background(func() error {
		_, err := e.node.NodeUnstageVolume(ctx, unstageReq)
		return err
	})
	if r := <-publish; r.err != nil {
		t.Fatalf("the reconciler's Publish: %v", r.err)
	}
	r := <-unstage
	wantCode(t, "NodeUnstageVolume while the reconciler publishes", r.err, codes.FailedPrecondition)
	if !r.issued.Before(e.only(t, "NodePublishVolume").End.Time) {
		t.Fatalf("precondition: NodeUnstageVolume was issued after NodePublishVolume ended; the race did not happen")
	}
	if n := len(e.calls(t, "NodeUnstageVolume")); n != 0 {
		t.Errorf("NodeUnstageVolume reached the plugin %d times while the volume was published", n)
	}

	if err := e.p.SetFaults(plugin.FaultRule{Method: "NodeUnpublishVolume", Delay: backendDelay}); err != nil {
		t.Fatal(err)
	}
	unpublish := background(func() error { return e.stack.Operations.Unpublish(ctx, key) })
	e.waitForCall(t, "NodeUnpublishVolume")
	unstage = background(func() error {
		_, err := e.node.NodeUnstageVolume(ctx, unstageReq)
		return err
	})
	if r := <-unpublish; r.err != nil {
		t.Fatalf("the reconciler's Unpublish: %v", r.err)
	}
	r = <-unstage
	if r.err != nil {
		t.Fatalf("NodeUnstageVolume after the unpublish: %v", r.err)
	}
	unpublishCall, unstageCall := e.only(t, "NodeUnpublishVolume"), e.only(t, "NodeUnstageVolume")
	if !r.issued.Before(unpublishCall.End.Time) {
		t.Fatalf("precondition: NodeUnstageVolume was issued after NodeUnpublishVolume ended; the race did not happen")
	}
	if unstageCall.Overlaps(unpublishCall) || unstageCall.Begin.Time.Before(unpublishCall.End.Time) {
		t.Errorf("NodeUnstageVolume [%v, %v] overlapped NodeUnpublishVolume [%v, %v]",
			unstageCall.Begin.Time, unstageCall.End.Time, unpublishCall.Begin.Time, unpublishCall.End.Time)
	}
	if vs := e.stack.World.Snapshot(); len(vs) != 0 {
		t.Errorf("actual state after both teardowns = %+v, want empty", vs)
	}
}

// The reconciler leaves what a CO staged alone: its Stage of the volume is
// refused, and its Unstage and Unpublish do nothing.
func TestReconcilerStepsLeaveTheCallersVolumeAlone(t *testing.T) {
	e := start(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	handle := e.createVolume(t, "owned")
	staging, target := e.path("staging"), e.path("target")
	key, src, _ := reconcilerUse(e.p.Name, handle)
	if _, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: staging, VolumeCapability: mountCap()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: handle, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap()}); err != nil {
		t.Fatal(err)
	}
	if err := e.stack.Operations.Stage(ctx, key.Volume, src, nil); err == nil {
		t.Error("the reconciler's Stage of a volume a CO staged succeeded")
	}
	if err := e.stack.Operations.Unstage(ctx, key.Volume); err != nil {
		t.Errorf("the reconciler's Unstage of a CO's volume: %v", err)
	}
	coPods := 0
	for _, v := range e.stack.World.Snapshot() {
		coPods += len(v.Pods)
		for _, p := range v.Pods {
			if err := e.stack.Operations.Unpublish(ctx, p.Key); err != nil {
				t.Errorf("the reconciler's Unpublish of a CO's target: %v", err)
			}
		}
	}
	if coPods != 1 {
		t.Errorf("the actual state holds %d pods, want the CO's one", coPods)
	}
	if n := len(e.calls(t, "NodeStageVolume", "NodeUnstageVolume", "NodeUnpublishVolume")); n != 1 {
		t.Errorf("the plugin saw %d stage/unstage/unpublish calls, want only the CO's stage", n)
	}
	v, _ := e.stack.World.Volume(key.Volume)
	if v.Stage != volume.Staged || !v.External || v.StagingPath != staging {
		t.Errorf("the CO's volume = %+v, want still Staged at %s", v, staging)
	}
}
