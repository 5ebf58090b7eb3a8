package operations

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// gate blocks a driver method: each call announces itself on arrived (with
// its target or staging path) and returns once release is closed.
type gate struct {
	arrived chan string
	release chan struct{}
}

func block(d *csiclienttest.Driver, method string) *gate {
	g := &gate{arrived: make(chan string, 16), release: make(chan struct{})}
	d.SetHandler(method, func(ctx context.Context, req proto.Message) (proto.Message, error) {
		path := ""
		switch r := req.(type) {
		case *csi.NodePublishVolumeRequest:
			path = r.GetTargetPath()
		case *csi.NodeStageVolumeRequest:
			path = r.GetStagingTargetPath()
		}
		g.arrived <- path
		select {
		case <-g.release:
			return nil, nil
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	})
	return g
}

// awaitTimeout bounds how long a test waits for a call to reach the driver.
const awaitTimeout = 30 * time.Second

// await receives one arrival or fails the test.
func (g *gate) await(t *testing.T, what string) string {
	t.Helper()
	timer := time.NewTimer(awaitTimeout)
	defer timer.Stop()
	select {
	case p := <-g.arrived:
		return p
	case <-timer.C:
		t.Fatalf("%s did not reach the driver within %v", what, awaitTimeout)
		return ""
	}
}

// realDriverHarness is a harness whose driver is a csiclienttest.Driver on
// a real unix socket, called through a real csiclient.Client.
func realDriverHarness(t *testing.T) (*harness, *csiclienttest.Driver) {
	t.Helper()
	d := csiclienttest.NewDriver(testDriver, testNode)
	d.SetNodeCapabilities(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	endpoint := csiclienttest.StartServer(t, d.Servers())
	client, err := csiclient.New(testContext(t), csiclient.Config{DriverName: testDriver, Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	h := newHarness(t, harnessOptions{client: client})
	h.noAttach()
	return h, d
}

// goErr runs fn in a goroutine and returns its result channel.
func goErr(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

func TestPublishesOfDifferentPodsOverlap(t *testing.T) {
	h, d := realDriverHarness(t)
	ctx := testContext(t)
	src := pvSource()
	if err := h.ops.Stage(ctx, volume.PersistentName(src.Driver, src.Handle), src, nil); err != nil {
		t.Fatal(err)
	}
	g := block(d, csi.Node_NodePublishVolume_FullMethodName)
	a := goErr(func() error { return h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")) })
	b := goErr(func() error { return h.ops.Publish(ctx, keyOf(src, "uid-b"), src, podVolume("uid-b", "pod-b")) })
	// Both calls are inside the driver before either is released: they overlap.
	targets := map[string]bool{g.await(t, "the first publish"): true, g.await(t, "the second publish"): true}
	if len(targets) != 2 {
		t.Errorf("both publishes went to the same target: %v", targets)
	}
	close(g.release)
	for _, ch := range []<-chan error{a, b} {
		if err := <-ch; err != nil {
			t.Errorf("Publish: %v", err)
		}
	}
}

func TestStageExcludesEveryOtherStepOnTheVolume(t *testing.T) {
	h, d := realDriverHarness(t)
	ctx := testContext(t)
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)

	// A publish that comes while the stage runs waits for it.
	stageGate := block(d, csi.Node_NodeStageVolume_FullMethodName)
	stage := goErr(func() error { return h.ops.Stage(ctx, name, src, nil) })
	stageGate.await(t, "the stage")
	pub := goErr(func() error { return h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")) })
	waitFor(t, "the publish to wait for the stage", func() bool { return h.ops.locks.waiters(name) == 1 })
	if n := d.CallCount(csi.Node_NodePublishVolume_FullMethodName); n != 0 {
		t.Fatalf("NodePublishVolume reached the driver %d times during NodeStageVolume", n)
	}
	close(stageGate.release)
	if err := <-stage; err != nil {
		t.Fatalf("Stage: %v", err)
	}
	if err := <-pub; err != nil {
		t.Fatalf("Publish after the stage: %v", err)
	}

	// A stage (or an unstage) that comes while publishes run waits for them.
	pubGate := block(d, csi.Node_NodePublishVolume_FullMethodName)
	pubB := goErr(func() error { return h.ops.Publish(ctx, keyOf(src, "uid-b"), src, podVolume("uid-b", "pod-b")) })
	pubGate.await(t, "pod b's publish")
	restage := goErr(func() error { return h.ops.Stage(ctx, name, src, nil) })
	unstage := goErr(func() error { return h.ops.Unstage(ctx, name) })
	waitFor(t, "stage and unstage to wait for the publish", func() bool { return h.ops.locks.waiters(name) == 2 })
	if n := d.CallCount(csi.Node_NodeStageVolume_FullMethodName); n != 1 {
		t.Fatalf("NodeStageVolume called %d times while a publish runs, want still 1", n)
	}
	close(pubGate.release)
	if err := <-pubB; err != nil {
		t.Fatal(err)
	}
	if err := <-restage; err != nil {
		t.Errorf("re-Stage: %v", err)
	}
	// The unstage saw both pods' publishes recorded and refused.
	if err := <-unstage; !errors.Is(err, volume.ErrInUse) {
		t.Errorf("Unstage while two pods are published = %v, want ErrInUse", err)
	}
	if n := d.CallCount(csi.Node_NodeUnstageVolume_FullMethodName); n != 0 {
		t.Errorf("NodeUnstageVolume called %d times", n)
	}
}

func TestSamePodNeverRunsTwiceAtOnce(t *testing.T) {
	h, d := realDriverHarness(t)
	ctx := testContext(t)
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	g := block(d, csi.Node_NodePublishVolume_FullMethodName)
	first := goErr(func() error { return h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")) })
	g.await(t, "the first publish")
	second := goErr(func() error { return h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")) })
	unpub := goErr(func() error { return h.ops.Unpublish(ctx, keyOf(src, "uid-a")) })
	waitFor(t, "the repeated steps to wait", func() bool { return h.ops.locks.waiters(name) == 2 })
	if n := d.CallCount(csi.Node_NodePublishVolume_FullMethodName); n != 1 {
		t.Fatalf("NodePublishVolume for the same pod reached the driver %d times at once", n)
	}
	close(g.release)
	for _, ch := range []<-chan error{first, second, unpub} {
		if err := <-ch; err != nil {
			t.Errorf("step: %v", err)
		}
	}
}

// TestRecordsAreDurableAroundTheCalls checks, from inside the driver, that
// the staged and publish records are on disk when NodeStageVolume and
// NodePublishVolume arrive, and still there while NodeUnstageVolume runs.
func TestRecordsAreDurableAroundTheCalls(t *testing.T) {
	h, d := realDriverHarness(t)
	ctx := testContext(t)
	src := pvSource()
	name := volume.PersistentName(src.Driver, src.Handle)
	st, _ := h.ops.Layout().Staging(src.ID)
	pub, _ := h.ops.Layout().Publishing("uid-a", "pv-1", volume.Filesystem)

	var mu sync.Mutex
	seen := map[string]error{}
	check := func(method string, read func() error) {
		d.SetHandler(method, func(context.Context, proto.Message) (proto.Message, error) {
			mu.Lock()
			defer mu.Unlock()
			seen[method] = read()
			return nil, nil
		})
	}
	readStage := func() error {
		rec, err := checkpoint.ReadStage(st.Record)
		if err == nil && (rec.VolumeHandle != "vol-1" || rec.StagingPath != st.Path) {
			err = errors.New("wrong staged record")
		}
		return err
	}
	check(csi.Node_NodeStageVolume_FullMethodName, readStage)
	check(csi.Node_NodeUnstageVolume_FullMethodName, readStage)
	check(csi.Node_NodePublishVolume_FullMethodName, func() error {
		rec, err := checkpoint.ReadPublish(pub.Record)
		if err == nil && rec.TargetPath != pub.Target {
			err = errors.New("wrong publish record")
		}
		return err
	})

	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Publish(ctx, keyOf(src, "uid-a"), src, podVolume("uid-a", "pod-a")); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Unpublish(ctx, keyOf(src, "uid-a")); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Unstage(ctx, name); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range []string{csi.Node_NodeStageVolume_FullMethodName, csi.Node_NodePublishVolume_FullMethodName, csi.Node_NodeUnstageVolume_FullMethodName} {
		err, ok := seen[m]
		if !ok {
			t.Errorf("%s never reached the driver", m)
		} else if err != nil {
			t.Errorf("during %s the record was not on disk: %v", m, err)
		}
	}
	if exists(t, st.Record) {
		t.Error("the staged record survived a successful unstage")
	}
}
