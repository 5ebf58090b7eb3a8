package check

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// scenario is one kubelet sequence the check drives the driver through.
type scenario struct {
	name, title string
	// needs returns why the driver cannot be checked with the scenario,
	// "" when it can.
	needs func(e *env) string
	run   func(ctx context.Context, r *run) error
}

// Expectations, as the report states them.
const (
	expectStage     = "NodeStageVolume to succeed"
	expectPublish   = "NodePublishVolume to succeed"
	expectUnpublish = "NodeUnpublishVolume to succeed and the target path to be unmounted (the kubelet removes it next)"
	expectUnstage   = "NodeUnstageVolume to succeed and nothing to stay mounted at the staging path"
)

func scenarios() []scenario {
	fsVolume := func(e *env) string {
		if !e.canCreate() && e.cfg.VolumeHandle == "" && !e.cfg.Ephemeral {
			return "no volume: the driver offers no CREATE_DELETE_VOLUME controller capability and no --volume-handle was given"
		}
		return ""
	}
	all := func(checks ...func(e *env) string) func(e *env) string {
		return func(e *env) string {
			for _, c := range checks {
				if reason := c(e); reason != "" {
					return reason
				}
			}
			return ""
		}
	}
	nodeCap := func(t csi.NodeServiceCapability_RPC_Type) func(e *env) string {
		return func(e *env) string {
			if !e.nodeCaps.Has(t) {
				return "the driver does not offer the node capability " + t.String()
			}
			return ""
		}
	}
	// persistent skips a scenario that an inline volume cannot go through.
	persistent := func(why string) func(e *env) string {
		return func(e *env) string {
			if e.cfg.Ephemeral {
				return "an ephemeral inline volume (--ephemeral) " + why
			}
			return ""
		}
	}
	const (
		onePod      = "is one pod's own: no other pod publishes it"
		neverStaged = "is never staged: the kubelet publishes it directly"
	)
	writable := func(e *env) string {
		if e.cfg.ReadOnly {
			return "the volumes are published read-only (--read-only): the scenario writes into the volume"
		}
		return ""
	}
	child := func(e *env) string {
		if e.cfg.Child == nil {
			return "no volume manager process can be started (check.Config.Child is not set)"
		}
		return ""
	}
	return []scenario{
		{name: "publish-parallel", title: "stage once, publish to 3 pods in parallel, unpublish in reverse, unstage",
			needs: all(persistent(onePod), fsVolume), run: publishParallel},
		{name: "repeat-calls", title: "every call repeated as the kubelet repeats it: after a restart, after an answer lost",
			needs: fsVolume, run: repeatCalls},
		{name: "readonly-readwrite", title: "read-write and read-only publishes of one staged volume",
			needs: all(persistent(onePod), fsVolume), run: readOnlyReadWrite},
		{name: "teardown-unmounted", title: "unpublish and unstage of paths no longer mounted",
			needs: fsVolume, run: teardownUnmounted},
		{name: "data-survives-republish", title: "data written survives unpublish, unstage, stage and publish",
			needs: all(persistent("lives as long as its pod's publish: its data is not meant to survive an unpublish"), fsVolume), run: dataSurvives},
		{name: "block-two-pods", title: "block volume published to two pods: written through one, read through the other",
			needs: func(e *env) string {
				if e.cfg.Ephemeral {
					return "an ephemeral inline volume (--ephemeral) is a filesystem volume: CSI inline volumes cannot be block volumes"
				}
				if !e.canCreate() {
					return "no block volume: the driver offers no CREATE_DELETE_VOLUME controller capability"
				}
				return ""
			}, run: blockTwoPods},
		{name: "volume-mount-group", title: "volume_mount_group honoured: the pod's fsGroup owns the published volume",
			needs: all(fsVolume, writable, nodeCap(csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)), run: volumeMountGroup},
		{name: "volume-stats", title: "NodeGetVolumeStats sane on a published volume, and following a write",
			needs: all(fsVolume, writable, nodeCap(csi.NodeServiceCapability_RPC_GET_VOLUME_STATS)), run: volumeStats},
		{name: "expand-published", title: "NodeExpandVolume on a published volume: statfs then offers at least the size asked for",
			needs: all(persistent("has no claim to resize: it is never expanded"), fsVolume, nodeCap(csi.NodeServiceCapability_RPC_EXPAND_VOLUME)), run: expandPublished},
		{name: "uncertain-stage", title: "NodeStageVolume held past a short deadline (uncertain), then retried",
			needs: all(persistent(neverStaged), fsVolume, nodeCap(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)), run: uncertainStage},
		{name: "crash-after-stage", title: "volume manager SIGKILLed between stage and publish, the lifecycle completed from its records",
			needs: all(persistent(neverStaged+": no stage to be killed after"), fsVolume, child), run: crashAfterStage},
		{name: "crash-after-unpublish", title: "volume manager SIGKILLed between unpublish and unstage, the lifecycle completed from its records",
			needs: all(fsVolume, child), run: crashAfterUnpublish},
		{name: "driver-restart", title: "driver killed and restarted while published: mounts probed and repaired as the agent does",
			needs: all(fsVolume, func(e *env) string {
				if e.proc == nil {
					return "the check does not run the driver: give --driver-command"
				}
				return ""
			}), run: driverRestart},
	}
}

// The scenarios.

func publishParallel(ctx context.Context, r *run) error {
	m, v, _, err := r.setup(ctx, volume.Filesystem)
	if err != nil {
		return err
	}
	const pods = 3
	errs := make([]error, pods)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Go(func() {
			key, pv := pod(v, i)
			errs[i] = publishRetryingAborted(ctx, func() error { return m.ops.Publish(ctx, key, v.src, pv) })
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fail(fmt.Sprintf("publish for pod-%d, in parallel with pod-0..%d", i, pods-1),
				"every publish to succeed: the kubelet publishes the pods of one staged volume in parallel "+
					"(Aborted, \"an operation is pending for the volume\", is retried with the kubelet's backoff)", err)
		}
	}
	targets := make([]string, pods)
	for i := range pods {
		key, _ := pod(v, i)
		if targets[i], err = m.target(key); err != nil {
			return err
		}
		if n, err := mountCount(targets[i]); err != nil {
			return err
		} else if n != 1 {
			return fail(fmt.Sprintf("publish for pod-%d", i), "the target path mounted once", fmt.Sprintf("%d mounts at %s", n, targets[i]))
		}
	}
	data := randomData(4096)
	if err := writeData(targets[0], data); err != nil {
		return fail("writing through pod-0's target", "a writable volume", err)
	}
	for i := 1; i < pods; i++ {
		if what := checkData(targets[i], data); what != "" {
			return fail(fmt.Sprintf("reading through pod-%d's target", i), "the data written through pod-0: every pod sees the one staged volume", what)
		}
	}
	return r.teardownAll(ctx, m, v, 2, 1, 0)
}

// abortedBackoff is the kubelet's backoff after a failed operation
// (nestedpendingoperations: 500 ms, doubling), for as many retries as a
// check waits: 500 ms + 1 s + 2 s + 4 s.
var abortedBackoff = []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}

// publishRetryingAborted runs publish, and again after the kubelet's
// backoff while the driver answers Aborted: the CSI spec lets a plugin
// refuse a call while another of the same volume is in flight, and the
// kubelet retries it. Any other error ends it.
func publishRetryingAborted(ctx context.Context, publish func() error) error {
	err := publish()
	for _, d := range abortedBackoff {
		if status.Code(err) != codes.Aborted {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(d):
		}
		err = publish()
	}
	return err
}

func repeatCalls(ctx context.Context, r *run) error {
	m, v, _, err := r.setup(ctx, volume.Filesystem)
	if err != nil {
		return err
	}
	if err := r.stage(ctx, m, v, nil, "stage repeated (as after a restart of the kubelet)"); err != nil {
		return err
	}
	key, pv := pod(v, 0)
	if _, err := r.publish(ctx, m, v, key, pv, "publish"); err != nil {
		return err
	}
	if _, err := r.publish(ctx, m, v, key, pv, "publish repeated (as after a restart of the kubelet)"); err != nil {
		return err
	}
	r.rec.interfere("NodeUnpublishVolume", loseAnswer)
	if err := m.ops.Unpublish(ctx, key); err == nil {
		return errors.New("the unpublish whose answer was lost did not fail")
	}
	if p, _ := m.world.Pod(key); p.State != volume.PublishUncertain {
		return fmt.Errorf("the unpublish whose answer was lost left the publish %v, not uncertain", p.State)
	}
	if err := r.unpublish(ctx, m, key, "unpublish repeated after its answer was lost"); err != nil {
		return err
	}
	if r.nodeCaps.StageUnstage() && !v.src.Inline {
		r.rec.interfere("NodeUnstageVolume", loseAnswer)
		if err := m.ops.Unstage(ctx, v.name); err == nil {
			return errors.New("the unstage whose answer was lost did not fail")
		}
	}
	return r.unstage(ctx, m, v, "unstage repeated after its answer was lost")
}

func readOnlyReadWrite(ctx context.Context, r *run) error {
	m, v, targets, err := r.setup(ctx, volume.Filesystem, 0)
	if err != nil {
		return err
	}
	key, pv := pod(v, 1)
	pv.ReadOnly = true
	ro, err := r.publish(ctx, m, v, key, pv, "read-only publish for pod-1")
	if err != nil {
		return err
	}
	data := randomData(4096)
	if err := writeData(targets[0], data); err != nil {
		return fail("writing through pod-0's read-write target", "a writable volume", err)
	}
	if what := checkData(ro, data); what != "" {
		return fail("reading through pod-1's read-only target", "the data written through pod-0", what)
	}
	err = writeData(ro, randomData(16))
	if err == nil {
		return fail("writing through pod-1's read-only target", "EROFS: NodePublishVolume with readonly=true mounts the target read-only", "the write succeeded")
	}
	if !errors.Is(err, syscall.EROFS) && !errors.Is(err, fs.ErrPermission) {
		return fail("writing through pod-1's read-only target", "EROFS (a read-only mount)", err)
	}
	if what := checkData(targets[0], data); what != "" {
		return fail("reading through pod-0's target", "the data written through pod-0", what)
	}
	return r.teardownAll(ctx, m, v, 1, 0)
}

func teardownUnmounted(ctx context.Context, r *run) error {
	m, v, targets, err := r.setup(ctx, volume.Filesystem, 0)
	if err != nil {
		return err
	}
	if err := unmountAll(targets[0]); err != nil {
		return err
	}
	key, _ := pod(v, 0)
	if err := r.unpublish(ctx, m, key, "unpublish of a target no longer mounted"); err != nil {
		return err
	}
	if v.src.Inline {
		return nil // never staged
	}
	if err := unmountAll(m.stagingPath(v)); err != nil {
		return err
	}
	return r.unstage(ctx, m, v, "unstage of a staging path no longer mounted")
}

// unmountAll unmounts what is mounted at path, as a node administrator
// or a reboot does behind the driver's back.
func unmountAll(path string) error {
	for {
		n, err := mountCount(path)
		if err != nil || n == 0 {
			return err
		}
		if err := syscall.Unmount(path, 0); err != nil {
			if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil {
				return fmt.Errorf("unmounting %s: %w", path, err)
			}
		}
	}
}

func dataSurvives(ctx context.Context, r *run) error {
	m, v, targets, err := r.setup(ctx, volume.Filesystem, 0)
	if err != nil {
		return err
	}
	data := randomData(64 << 10)
	if err := writeData(targets[0], data); err != nil {
		return fail("writing through pod-0's target", "a writable volume", err)
	}
	if err := r.teardownAll(ctx, m, v, 0); err != nil {
		return err
	}
	target, err := r.restage(ctx, m, v, 1, "stage again", "publish for pod-1")
	if err != nil {
		return err
	}
	if what := checkData(target, data); what != "" {
		return fail("reading through pod-1's target", "the data pod-0 wrote: a volume keeps its data across unstage and stage (no new file system on a volume that has one)", what)
	}
	return r.teardownAll(ctx, m, v, 1)
}

func blockTwoPods(ctx context.Context, r *run) error {
	m, v, devs, err := r.setup(ctx, volume.Block, 0, 1)
	if err != nil {
		return err
	}
	data := randomData(4096)
	if err := writeDevice(devs[0], data); err != nil {
		return fail("writing through pod-0's device", "a writable block device", err)
	}
	got, err := readDevice(devs[1], len(data))
	if err != nil {
		return fail("reading through pod-1's device", "the block written through pod-0", err)
	}
	if string(got) != string(data) {
		return fail("reading through pod-1's device", "the block written through pod-0: both pods' devices are the one volume", "other bytes")
	}
	return r.teardownAll(ctx, m, v, 1, 0)
}

func volumeMountGroup(ctx context.Context, r *run) error {
	m, v, err := r.managerAndVolume(ctx, volume.Filesystem)
	if err != nil {
		return err
	}
	group := int64(54321)
	if err := r.stage(ctx, m, v, &group, "stage with volume_mount_group"); err != nil {
		return err
	}
	key, pv := pod(v, 0)
	pv.FSGroup = &group
	target, err := r.publish(ctx, m, v, key, pv, "publish with volume_mount_group")
	if err != nil {
		return err
	}
	fi, err := os.Stat(target)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int64(st.Gid) != group || fi.Mode().Perm()&0o020 == 0 {
		return fail("the published volume's group", fmt.Sprintf("group %d with write access (volume_mount_group): with VOLUME_MOUNT_GROUP the kubelet leaves the pod's fsGroup to the driver and changes no ownership itself", group),
			fmt.Sprintf("group %d, mode %v", st.Gid, fi.Mode().Perm()))
	}
	return r.teardownAll(ctx, m, v, 0)
}

func volumeStats(ctx context.Context, r *run) error {
	m, v, targets, err := r.setup(ctx, volume.Filesystem, 0)
	if err != nil {
		return err
	}
	stats := func(step string) (*csi.VolumeUsage, error) {
		req := &csi.NodeGetVolumeStatsRequest{VolumeId: v.src.Handle, VolumePath: targets[0]}
		if r.nodeCaps.StageUnstage() {
			req.StagingTargetPath = m.stagingPath(v)
		}
		resp, err := r.rec.NodeGetVolumeStats(ctx, req)
		if err != nil {
			return nil, fail(step, "NodeGetVolumeStats to succeed on a published volume", err)
		}
		var bytes *csi.VolumeUsage
		for _, u := range resp.GetUsage() {
			if u.GetTotal() < 0 || u.GetUsed() < 0 || u.GetAvailable() < 0 || (u.GetTotal() > 0 && (u.GetUsed() > u.GetTotal() || u.GetAvailable() > u.GetTotal())) {
				return nil, fail(step, "usage with 0 <= used, available <= total", fmt.Sprintf("%s total %d used %d available %d", u.GetUnit(), u.GetTotal(), u.GetUsed(), u.GetAvailable()))
			}
			if u.GetUnit() == csi.VolumeUsage_BYTES {
				bytes = u
			}
		}
		if bytes == nil || bytes.GetTotal() == 0 {
			return nil, fail(step, "a BYTES usage with its total (the kubelet's kubelet_volume_stats_capacity_bytes)", resp.GetUsage())
		}
		return bytes, nil
	}
	before, err := stats("NodeGetVolumeStats")
	if err != nil {
		return err
	}
	const written = 1 << 20
	if err := writeData(targets[0], randomData(written)); err != nil {
		return fail("writing 1 MiB through the target", "a writable volume", err)
	}
	after, err := stats("NodeGetVolumeStats after writing 1 MiB")
	if err != nil {
		return err
	}
	if after.GetUsed()-before.GetUsed() < written/2 {
		return fail("NodeGetVolumeStats after writing 1 MiB", "used bytes grown by about 1 MiB (kubelet_volume_stats_used_bytes)",
			fmt.Sprintf("used %d before, %d after", before.GetUsed(), after.GetUsed()))
	}
	return r.teardownAll(ctx, m, v, 0)
}

func expandPublished(ctx context.Context, r *run) error {
	m, v, targets, err := r.setup(ctx, volume.Filesystem, 0)
	if err != nil {
		return err
	}
	before, err := statfsBytes(targets[0])
	if err != nil {
		return err
	}
	// Ask for twice the volume's size: its capacity, or what statfs shows when the driver did not
	// say. A directory-backed volume (csi-driver-host-path) shows the host's file system, larger than
	// the volume: it already offers what is asked, and that is what the kubelet relies on.
	size := v.src.CapacityBytes
	if size <= 0 {
		size = before
	}
	required := 2 * size
	if r.hasController && r.ctrlCaps.Has(csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
		start := time.Now()
		_, err := r.ctrl.Controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: v.src.Handle, CapacityRange: &csi.CapacityRange{RequiredBytes: required},
			VolumeCapability: &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
		})
		r.rec.controller("ControllerExpandVolume", start, err)
		if err != nil {
			return fail("ControllerExpandVolume", "the volume grown", err)
		}
	}
	key, _ := pod(v, 0)
	if _, err := m.ops.Expand(ctx, key, v.src, required); err != nil {
		return fail("NodeExpandVolume on the published volume", "NodeExpandVolume to succeed", err)
	}
	after, err := statfsBytes(targets[0])
	if err != nil {
		return err
	}
	if after < required {
		return fail("statfs of the target after NodeExpandVolume", fmt.Sprintf("at least the %d bytes asked for: the kubelet reports the claim resized once NodeExpandVolume succeeded", required),
			fmt.Sprintf("%d bytes before, %d after", before, after))
	}
	return r.teardownAll(ctx, m, v, 0)
}
