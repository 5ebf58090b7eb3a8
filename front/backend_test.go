package front_test

import (
	"context"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// answerBound is how long the front may take to report a dead or hung
// backend: the identity timeout of the test stack (2s) and ample slack.
const answerBound = 10 * time.Second

// timed runs fn and returns its error and how long it took.
func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// Killing the backend mid-call: the call in flight and every later call
// through the front answer Unavailable, promptly; a hung backend does not
// hang Probe. After the backend restarts and registers again, calls through
// the same front work again, and the step the kill left uncertain completes.
func TestBackendKilledThenRestarted(t *testing.T) {
	e := start(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	h1, h2 := e.createVolume(t, "survivor"), e.createVolume(t, "in-flight")
	staging1, staging2, target1 := e.path("staging1"), e.path("staging2"), e.path("target1")
	stage := func(handle, staging string) error {
		_, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: staging, VolumeCapability: mountCap()})
		return err
	}
	publish1 := func() error {
		_, err := e.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: h1, StagingTargetPath: staging1, TargetPath: target1, VolumeCapability: mountCap()})
		return err
	}
	if err := stage(h1, staging1); err != nil {
		t.Fatal(err)
	}

	// A hung backend: Probe is bounded.
	if err := e.p.SetFaults(plugin.FaultRule{Method: "Probe", Hang: true}); err != nil {
		t.Fatal(err)
	}
	took, err := timed(func() error { _, err := e.id.Probe(ctx, &csi.ProbeRequest{}); return err })
	wantCode(t, "Probe of a hung backend", err, codes.Unavailable)
	t.Logf("Probe of a hung backend: %v after %v", status.Code(err), took)
	if took > answerBound {
		t.Errorf("Probe of a hung backend took %v, want at most %v", took, answerBound)
	}

	// Killed during a NodeStageVolume.
	if err := e.p.SetFaults(plugin.FaultRule{Method: "NodeStageVolume", VolumeID: h2, Hang: true}); err != nil {
		t.Fatal(err)
	}
	inFlight := background(func() error { return stage(h2, staging2) })
	e.waitForCall(t, "NodeStageVolume")
	killed := time.Now()
	if err := e.p.Kill(); err != nil {
		t.Fatal(err)
	}
	r := <-inFlight
	wantCode(t, "NodeStageVolume in flight when the backend died", r.err, codes.Unavailable)
	t.Logf("NodeStageVolume in flight: %v %v after the kill", status.Code(r.err), time.Since(killed))
	if took := time.Since(killed); took > answerBound {
		t.Errorf("the call in flight answered %v after the kill, want at most %v", took, answerBound)
	}
	name2 := volume.PersistentName(e.p.Name, h2)
	if v, _ := e.stack.World.Volume(name2); v.Stage != volume.StageUncertain || !v.External {
		t.Errorf("volume whose stage was cut short = %+v, want StageUncertain, External", v)
	}

	// Every service answers Unavailable while the backend is down.
	for what, call := range map[string]func() error{
		"Probe":             func() error { _, err := e.id.Probe(ctx, &csi.ProbeRequest{}); return err },
		"GetPluginInfo":     func() error { _, err := e.id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); return err },
		"ListVolumes":       func() error { _, err := e.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{}); return err },
		"NodeGetInfo":       func() error { _, err := e.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); return err },
		"NodePublishVolume": publish1,
	} {
		took, err := timed(call)
		wantCode(t, what+" with the backend down", err, codes.Unavailable)
		t.Logf("%s with the backend down: %v after %v", what, status.Code(err), took)
		if took > answerBound {
			t.Errorf("%s with the backend down took %v, want at most %v", what, took, answerBound)
		}
	}

	// The backend comes back and registers again; nothing else restarts.
	if err := e.p.ClearFaults(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if err := e.p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		resp, err := e.id.Probe(ctx, &csi.ProbeRequest{})
		return err == nil && (resp.GetReady() == nil || resp.GetReady().GetValue()), nil
	})
	if err != nil {
		t.Fatalf("the front did not see the restarted backend: %v", err)
	}
	t.Logf("Probe ready through the front %v after the restart began", time.Since(restarted))
	if _, err := e.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); err != nil {
		t.Errorf("NodeGetInfo after the restart: %v", err)
	}
	if _, err := e.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{}); err != nil {
		t.Errorf("ListVolumes after the restart: %v", err)
	}
	if err := publish1(); err != nil {
		t.Errorf("NodePublishVolume after the restart: %v", err)
	}
	if err := stage(h2, staging2); err != nil {
		t.Errorf("retried NodeStageVolume after the restart: %v", err)
	}
	if v, _ := e.stack.World.Volume(name2); v.Stage != volume.Staged {
		t.Errorf("volume whose stage was retried = %+v, want Staged", v)
	}
	if got := status.Code(stage(h2, staging2)); got != codes.OK {
		t.Errorf("repeated NodeStageVolume: %v", got)
	}
}

// A backend that stops cleanly deregisters (its registration socket goes):
// the front then reports it not ready and answers Unavailable. When it
// registers again, with a new connection in the registry, the front uses
// that connection from the next call on.
func TestBackendDeregisteredThenRegisteredAgain(t *testing.T) {
	e := start(t, plugin.DefaultCapabilities())
	ctx := testContext(t)
	before, ok := e.stack.Registry.Client(e.p.Name)
	if !ok {
		t.Fatal("the backend is not registered")
	}
	if err := e.p.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the registry to drop the backend", func() bool {
		_, ok := e.stack.Registry.Client(e.p.Name)
		return !ok
	})
	probe, err := e.id.Probe(ctx, &csi.ProbeRequest{})
	if err != nil || probe.GetReady() == nil || probe.GetReady().GetValue() {
		t.Errorf("Probe with the backend deregistered = %v, %v; want ready=false", probe, err)
	}
	_, err = e.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	wantCode(t, "NodeGetInfo with the backend deregistered", err, codes.Unavailable)
	_, err = e.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	wantCode(t, "ListVolumes with the backend deregistered", err, codes.Unavailable)

	if err := e.p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the backend to register again", func() bool {
		_, ok := e.stack.Registry.Client(e.p.Name)
		return ok
	})
	after, _ := e.stack.Registry.Client(e.p.Name)
	if after == before {
		t.Error("the registry kept the old connection; this test needs a re-registration")
	}
	if _, err := e.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); err != nil {
		t.Errorf("NodeGetInfo after the re-registration: %v", err)
	}
	probe, err = e.id.Probe(ctx, &csi.ProbeRequest{})
	if err != nil || (probe.GetReady() != nil && !probe.GetReady().GetValue()) {
		t.Errorf("Probe after the re-registration = %v, %v; want ready", probe, err)
	}
	handle := e.createVolume(t, "after-reregistration")
	if _, err := e.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: e.path("staging"), VolumeCapability: mountCap()}); err != nil {
		t.Errorf("NodeStageVolume after the re-registration: %v", err)
	}
}

// waitFor polls cond until it holds, failing t after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
