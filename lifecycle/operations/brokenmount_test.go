package operations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestIsBrokenMount(t *testing.T) {
	stat := func(errno syscall.Errno) error { return &fs.PathError{Op: "stat", Path: "/t", Err: errno} }
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"nil":                    {nil, false},
		"ENOTCONN":               {stat(syscall.ENOTCONN), true},
		"EIO":                    {stat(syscall.EIO), true},
		"ESTALE":                 {stat(syscall.ESTALE), true},
		"ECONNABORTED":           {stat(syscall.ECONNABORTED), true},
		"bare ECONNABORTED":      {syscall.ECONNABORTED, true},
		"wrapped ENOTCONN":       {fmt.Errorf("probing: %w", stat(syscall.ENOTCONN)), true},
		"wrapped ECONNABORTED":   {fmt.Errorf("probing: %w", stat(syscall.ECONNABORTED)), true},
		"ENOENT (missing)":       {stat(syscall.ENOENT), false},
		"EINVAL":                 {stat(syscall.EINVAL), false},
		"not an errno":           {errors.New("transport endpoint is not connected"), false},
		"ECONNREFUSED (no stat)": {stat(syscall.ECONNREFUSED), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := IsBrokenMount(tc.err); got != tc.want {
				t.Errorf("IsBrokenMount(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// brokenPaths makes paths look like broken mounts (a stat answers errno)
// until a teardown call of the driver for them.
type brokenPaths struct {
	mu     sync.Mutex
	errno  syscall.Errno
	broken map[string]bool
	// heal says whether the driver's teardown of a path fixes it.
	heal bool
}

func (b *brokenPaths) stat(p string) (fs.FileInfo, error) {
	b.mu.Lock()
	broken := b.broken[p]
	b.mu.Unlock()
	if broken {
		return nil, &fs.PathError{Op: "stat", Path: p, Err: b.errno}
	}
	return os.Stat(p)
}

func (b *brokenPaths) set(p string, broken bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.broken[p] = broken
}

// strictClient is the fake driver as a stock FUSE driver: NodePublishVolume
// and NodeStageVolume of a broken path fail (Internal, the stat error), a
// teardown of it unmounts it.
type strictClient struct {
	*csiclienttest.Client
	paths *brokenPaths
}

func (c strictClient) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) error {
	if _, err := c.paths.stat(req.GetTargetPath()); IsBrokenMount(err) {
		return status.Error(codes.Internal, err.Error())
	}
	return c.Client.NodePublishVolume(ctx, req)
}

func (c strictClient) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) error {
	err := c.Client.NodeUnpublishVolume(ctx, req)
	if err == nil && c.paths.heal {
		c.paths.set(req.GetTargetPath(), false)
	}
	return err
}

func (c strictClient) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) error {
	if _, err := c.paths.stat(req.GetStagingTargetPath()); IsBrokenMount(err) {
		return status.Error(codes.Internal, err.Error())
	}
	return c.Client.NodeStageVolume(ctx, req)
}

func (c strictClient) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) error {
	err := c.Client.NodeUnstageVolume(ctx, req)
	if err == nil && c.paths.heal {
		c.paths.set(req.GetStagingTargetPath(), false)
	}
	return err
}

// strictHarness is a staged harness over strictClient, with pod-1
// published.
func strictHarness(t *testing.T, errno syscall.Errno) (*harness, *brokenPaths, volume.Source, volume.PodKey, string) {
	t.Helper()
	h, src := stagedHarness(t, harnessOptions{})
	paths := &brokenPaths{errno: errno, broken: map[string]bool{}, heal: true}
	h.ops.stat = paths.stat
	h.mu.Lock()
	h.drivers[testDriver] = strictClient{Client: h.client, paths: paths}
	h.mu.Unlock()
	key := keyOf(src, "pod-1")
	if err := h.ops.Publish(testContext(t), key, src, podVolume("pod-1", "p1")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	p, _ := h.world.Pod(key)
	return h, paths, src, key, p.TargetPath
}

// nodeCalls lists the fake driver's node calls since the mark.
func nodeCalls(h *harness, from int) []string {
	h.client.Mu.Lock()
	defer h.client.Mu.Unlock()
	var out []string
	for _, c := range h.client.Calls[from:] {
		if c.Method != "NodeCapabilities" {
			out = append(out, c.Method)
		}
	}
	return out
}

// recordOf is the publish record of a filesystem target.
func recordOf(target string) string { return filepath.Join(filepath.Dir(target), paths.DataFileName) }

func callMark(h *harness) int {
	h.client.Mu.Lock()
	defer h.client.Mu.Unlock()
	return len(h.client.Calls)
}

// TestPublishRepairsBrokenTarget: a publish marked uncertain (by the mount
// check) whose target is a broken mount is unpublished first, then
// published, for every broken-mount errno; a driver that refuses to publish
// over a broken target gets only the working sequence.
func TestPublishRepairsBrokenTarget(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOTCONN, syscall.EIO, syscall.ESTALE, syscall.ECONNABORTED} {
		t.Run(errno.Error(), func(t *testing.T) {
			ctx := testContext(t)
			h, paths, src, key, target := strictHarness(t, errno)
			paths.set(target, true)
			if err := h.ops.MarkMountUncertain(ctx, key, volume.StepPublish, ErrMountBroken); err != nil {
				t.Fatal(err)
			}
			mark := callMark(h)
			if err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1")); err != nil {
				t.Fatalf("Publish of the broken target: %v", err)
			}
			if got, want := nodeCalls(h, mark), []string{"NodeUnpublishVolume", "NodePublishVolume"}; !slices.Equal(got, want) {
				t.Errorf("calls %q, want %q", got, want)
			}
			if p, _ := h.world.Pod(key); p.State != volume.Published {
				t.Errorf("publish state %v, want Published", p.State)
			}
			if !exists(t, recordOf(target)) {
				t.Errorf("the publish record is gone")
			}
		})
	}
}

// TestPublishBrokenTargetUnpublishFails: a NodeUnpublishVolume of the
// broken target that fails, or that succeeds and leaves the target broken,
// leaves the publish uncertain, with its record, and no NodePublishVolume
// is sent; the retry repairs it.
func TestPublishBrokenTargetUnpublishFails(t *testing.T) {
	ctx := testContext(t)
	h, paths, src, key, target := strictHarness(t, syscall.ENOTCONN)
	paths.set(target, true)
	if err := h.ops.MarkMountUncertain(ctx, key, volume.StepPublish, ErrMountBroken); err != nil {
		t.Fatal(err)
	}
	h.client.Mu.Lock()
	h.client.NextNodeUnpublishVolumeErr = status.Error(codes.Internal, "umount: device busy")
	h.client.Mu.Unlock()
	mark := callMark(h)
	if err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1")); err == nil {
		t.Fatal("Publish succeeded although the unpublish of the broken target failed")
	}
	paths.mu.Lock()
	paths.heal = false
	paths.mu.Unlock()
	h.client.Mu.Lock()
	h.client.NextNodeUnpublishVolumeErr = nil
	h.client.Mu.Unlock()
	err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1"))
	if !errors.Is(err, ErrBrokenMountStays) {
		t.Fatalf("Publish after an unpublish that left the mount broken: %v, want ErrBrokenMountStays", err)
	}
	if got, want := nodeCalls(h, mark), []string{"NodeUnpublishVolume", "NodeUnpublishVolume"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q (no publish over the broken target)", got, want)
	}
	if p, _ := h.world.Pod(key); p.State != volume.PublishUncertain {
		t.Errorf("publish state %v, want PublishUncertain", p.State)
	}
	if !exists(t, recordOf(target)) {
		t.Errorf("the publish record is gone")
	}
	paths.mu.Lock()
	paths.heal = true
	paths.mu.Unlock()
	if err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1")); err != nil {
		t.Fatalf("Publish retried: %v", err)
	}
	if p, _ := h.world.Pod(key); p.State != volume.Published {
		t.Errorf("publish state %v, want Published", p.State)
	}
}

// TestPublishHealthyTargetNoUnpublish: a publish repeated over a target
// that is not broken gets no NodeUnpublishVolume.
func TestPublishHealthyTargetNoUnpublish(t *testing.T) {
	ctx := testContext(t)
	h, _, src, key, _ := strictHarness(t, syscall.ENOTCONN)
	if err := h.ops.MarkMountUncertain(ctx, key, volume.StepPublish, errors.New("timed out")); err != nil {
		t.Fatal(err)
	}
	mark := callMark(h)
	if err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1")); err != nil {
		t.Fatal(err)
	}
	if got, want := nodeCalls(h, mark), []string{"NodePublishVolume"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
}

// TestStageRepairsBrokenStagingPath: a Stage of a staged volume whose
// staging path is a broken mount unpublishes its targets, unstages, stages,
// and leaves the publishes uncertain for the reconciler, which publishes
// them again; with a healthy target nothing is torn down.
func TestStageRepairsBrokenStagingPath(t *testing.T) {
	ctx := testContext(t)
	h, paths, src, key, target := strictHarness(t, syscall.ENOTCONN)
	name := key.Volume
	v, _ := h.world.Volume(name)
	paths.set(v.StagingPath, true)
	paths.set(target, true)
	mark := callMark(h)
	if err := h.ops.Stage(ctx, name, src, nil); err != nil {
		t.Fatalf("Stage at the broken staging path: %v", err)
	}
	if got, want := nodeCalls(h, mark), []string{"NodeUnpublishVolume", "NodeUnstageVolume", "NodeStageVolume"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	if v, _ := h.world.Volume(name); v.Stage != volume.Staged {
		t.Errorf("stage state %v, want Staged", v.Stage)
	}
	p, _ := h.world.Pod(key)
	if p.State != volume.PublishUncertain || p.LastError == nil || !errors.Is(p.LastError.Err, ErrMountBroken) {
		t.Errorf("publish %v (%v), want PublishUncertain with ErrMountBroken", p.State, p.LastError)
	}
	if !exists(t, recordOf(target)) {
		t.Errorf("the publish record is gone")
	}
	if err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1")); err != nil {
		t.Fatalf("Publish after the repair: %v", err)
	}

	// The staging path broken again, the target a healthy mount: the
	// running pod's mount is left alone.
	paths.set(v.StagingPath, true)
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	h.mounts.mu.Lock()
	h.mounts.mounted[target] = true
	h.mounts.mu.Unlock()
	mark = callMark(h)
	_ = h.ops.Stage(ctx, name, src, nil)
	if got := nodeCalls(h, mark); slices.Contains(got, "NodeUnpublishVolume") || slices.Contains(got, "NodeUnstageVolume") {
		t.Errorf("calls %q with a healthy target, want no teardown", got)
	}
}

// TestPublishRepairsTargetTheCheckFoundBroken: a publish the mount check
// marked uncertain with ErrMountBroken (its target missing or no longer a
// mount point, which a stat does not show) is unpublished first too, as a
// driver that records its targets (csi-driver-host-path) needs; unless the
// target is a healthy mount again by then.
func TestPublishRepairsTargetTheCheckFoundBroken(t *testing.T) {
	ctx := testContext(t)
	h, _, src, key, target := strictHarness(t, syscall.ENOTCONN)
	broken := fmt.Errorf("%w: %s is not a mount point", ErrMountBroken, target)
	if err := h.ops.MarkMountUncertain(ctx, key, volume.StepPublish, broken); err != nil {
		t.Fatal(err)
	}
	mark := callMark(h)
	if err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1")); err != nil {
		t.Fatal(err)
	}
	if got, want := nodeCalls(h, mark), []string{"NodeUnpublishVolume", "NodePublishVolume"}; !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}

	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	h.mounts.mu.Lock()
	h.mounts.mounted[target] = true
	h.mounts.mu.Unlock()
	if err := h.ops.MarkMountUncertain(ctx, key, volume.StepPublish, broken); err != nil {
		t.Fatal(err)
	}
	mark = callMark(h)
	if err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1")); err != nil {
		t.Fatal(err)
	}
	if got, want := nodeCalls(h, mark), []string{"NodePublishVolume"}; !slices.Equal(got, want) {
		t.Errorf("calls %q with a healthy mount, want %q", got, want)
	}
}

// TestPublishTearsDownOnlyDeadTargets: a publish repeated over a published
// target (a requiresRepublish, not marked by the mount check) unpublishes
// it first only when its mount is dead (ENOTCONN, ECONNABORTED); a stat
// error a mount that still serves its pod may answer (EIO, EACCES, ...)
// gets the publish alone, whatever the driver answers to it.
func TestPublishTearsDownOnlyDeadTargets(t *testing.T) {
	// want is the calls of a dead mount; nil: no NodeUnpublishVolume.
	for _, tc := range []struct {
		errno syscall.Errno
		want  []string
	}{
		{syscall.ENOTCONN, []string{"NodeUnpublishVolume", "NodePublishVolume"}},
		{syscall.ECONNABORTED, []string{"NodeUnpublishVolume", "NodePublishVolume"}},
		{syscall.EIO, nil},
		{syscall.EACCES, nil},
		{syscall.EWOULDBLOCK, nil},
	} {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			ctx := testContext(t)
			h, paths, src, key, target := strictHarness(t, tc.errno)
			paths.set(target, true)
			mark := callMark(h)
			err := h.ops.Publish(ctx, key, src, podVolume("pod-1", "p1"))
			// The strict driver refuses to publish over the broken target
			// it was not asked to unpublish: that error is the driver's.
			if dead := len(tc.want) == 2; dead && err != nil {
				t.Fatalf("Publish: %v", err)
			}
			got := nodeCalls(h, mark)
			if dead := len(tc.want) == 2; dead && !slices.Equal(got, tc.want) {
				t.Errorf("calls %q, want %q", got, tc.want)
			}
			if !slices.Equal(tc.want, []string{"NodeUnpublishVolume", "NodePublishVolume"}) && slices.Contains(got, "NodeUnpublishVolume") {
				t.Errorf("calls %q: a mount that may still serve its pod was unpublished", got)
			}
		})
	}
}
