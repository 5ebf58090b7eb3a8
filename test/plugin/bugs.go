package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// Bug names a driver bug the plugin can be switched to (the control file's "bugs"). Each is a
// mistake real node plugins make in the sequences the kubelet drives, and each is what one scenario
// of `csi-volmgr check` is there to catch; the plugin without bugs passes them all.
type Bug string

// The bugs the plugin knows.
const (
	// BugFailConcurrentPublish: NodePublishVolume holds a volume for a while (1s) and fails
	// (Internal) a publish of the same volume for another target meanwhile, instead of serving the
	// parallel publishes the kubelet makes for the pods of one volume. (Aborted would be within
	// the spec: the kubelet retries it.)
	BugFailConcurrentPublish Bug = "fail-concurrent-publish"
	// BugPublishStacksMount: a repeated NodePublishVolume at a target that is already mounted
	// mounts again on top instead of answering OK (not idempotent).
	BugPublishStacksMount Bug = "publish-stacks-mount"
	// BugStageUncheckedMount: NodeStageVolume mounts first and records the stage last (after a
	// moment, giving up when the call is cancelled), and a stage it has no record of mounts without
	// looking at the mount table: a stage cancelled half-way (its caller died) and repeated leaves
	// two mounts stacked at the staging path.
	BugStageUncheckedMount Bug = "stage-unchecked-mount"
	// BugUnpublishTrustsRecord: NodeUnpublishVolume forgets the target first and unmounts after a
	// moment (giving up when the call is cancelled), and answers OK without unmounting for a target
	// it has no record of: an unpublish cancelled half-way (its caller died) and repeated leaves the
	// target mounted.
	BugUnpublishTrustsRecord Bug = "unpublish-trusts-record"
	// BugKeepBrokenMount: a NodeUnpublishVolume or NodeUnstageVolume of a FUSE mount that is broken
	// (the driver restarted) answers OK and keeps the broken mount, and so does a repeated
	// NodeStageVolume at a broken FUSE staging path.
	BugKeepBrokenMount Bug = "keep-broken-mount"
	// BugStageInProgressOK: a NodeStageVolume repeated while the first one of the volume is still
	// running (slowed to 1.5s by the bug) answers OK at once, before the volume is staged.
	BugStageInProgressOK Bug = "stage-in-progress-ok"
	// BugUnmountedTeardownFails: NodeUnpublishVolume and NodeUnstageVolume of a path the plugin
	// recorded but that is no longer mounted fail (umount's EINVAL passed on) instead of succeeding.
	BugUnmountedTeardownFails Bug = "unmounted-teardown-fails"
	// BugIgnoreReadOnly: NodePublishVolume with readonly=true mounts read-write.
	BugIgnoreReadOnly Bug = "ignore-readonly"
	// BugBlockPublishWithoutMount: NodePublishVolume of a block volume creates the target file and
	// never bind-mounts the device onto it.
	BugBlockPublishWithoutMount Bug = "block-publish-without-mount"
	// BugIgnoreMountGroup: NodeStageVolume ignores volume_mount_group although VOLUME_MOUNT_GROUP is
	// advertised.
	BugIgnoreMountGroup Bug = "ignore-mount-group"
	// BugStatsUsedZero: NodeGetVolumeStats reports 0 bytes used, whatever the volume holds.
	BugStatsUsedZero Bug = "stats-used-zero"
	// BugExpandNoop: NodeExpandVolume answers with the required capacity without growing anything.
	BugExpandNoop Bug = "expand-noop"
	// BugFormatOnStage: NodeStageVolume of a volume that is not staged empties it first, as a driver
	// that formats without looking for an existing file system does.
	BugFormatOnStage Bug = "format-on-stage"
)

// AllBugs returns every bug the plugin knows.
func AllBugs() []Bug {
	return []Bug{BugFailConcurrentPublish, BugPublishStacksMount, BugStageUncheckedMount, BugUnpublishTrustsRecord,
		BugKeepBrokenMount, BugStageInProgressOK, BugUnmountedTeardownFails, BugIgnoreReadOnly,
		BugBlockPublishWithoutMount, BugIgnoreMountGroup, BugStatsUsedZero, BugExpandNoop, BugFormatOnStage}
}

// bug says whether the control file switches bug b on.
func (d *driver) bug(ctx context.Context, b Bug) bool { return d.faults.hasBug(ctx, b) }

// bugPause waits d, or until ctx ends: false then.
func bugPause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// emptyDir removes everything in dir (BugFormatOnStage).
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("empty %s: %w", dir, err)
		}
	}
	return nil
}

// Pauses of the bugs that make a step slow.
const (
	bugSlowStage      = 800 * time.Millisecond
	bugSlowFirstStage = 1500 * time.Millisecond
	bugSlowPublish    = time.Second
)

// failUnmounted is BugUnmountedTeardownFails: the error umount(2) gives for a path that is not a
// mount point, as a driver that unmounts without looking passes it on.
func failUnmounted(m mount.Interface, path string) error {
	mounted, err := m.IsMountPoint(path)
	if err != nil || mounted {
		return nil
	}
	return status.Errorf(codes.Internal, "bug unmounted-teardown-fails: umount %s: %v", path, unix.EINVAL)
}

// keptBroken is BugKeepBrokenMount in a teardown: true when path is a broken mount of a FUSE
// volume that the bug keeps (the call then answers OK).
func keptBroken(ctx context.Context, d *driver, logger klog.Logger, v *Volume, path string) bool {
	if !isFuse(v) || !d.bug(ctx, BugKeepBrokenMount) {
		return false
	}
	if _, err := os.Stat(path); !isBrokenMount(err) {
		return false
	}
	logger.Info("Bug keep-broken-mount: answering OK and keeping the broken mount", "path", path)
	return true
}
