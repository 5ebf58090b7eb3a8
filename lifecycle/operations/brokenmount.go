package operations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
)

// IsBrokenMount says whether err, from a stat of a path, means that the
// path is a broken mount: a mount whose server is gone (a FUSE driver's
// daemon that died, a network file system that went away). It is
// k8s.io/mount-utils' IsCorruptedMnt (ENOTCONN, ESTALE, EIO, EACCES,
// EHOSTDOWN, EWOULDBLOCK, ENODEV) plus ECONNABORTED, which a FUSE mount
// answers to a request in flight when its daemon died, and it also finds
// the errno in a wrapped error. The mount check and the repair before a
// set-up use this one definition.
func IsBrokenMount(err error) bool {
	if err == nil {
		return false
	}
	if mount.IsCorruptedMnt(err) {
		return true
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	return errno == syscall.ECONNABORTED || mount.IsCorruptedMnt(errno)
}

// StatMount is os.Stat for telling a broken mount: when the stat succeeds,
// a statfs of the path follows, and its error is returned when it is a
// broken mount's. The kernel answers a stat of a FUSE mount from its
// attribute cache, also after the mount's daemon died (JuiceFS's mounts
// keep answering for as long as their attributes are cached), while a
// statfs always reaches the daemon, and a dead one's mount answers it with
// ENOTCONN.
func StatMount(path string) (fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fi, err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); IsBrokenMount(err) {
		return nil, &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	return fi, nil
}

// statBroken stats path and returns the error when it is a broken mount,
// nil otherwise (healthy, missing or another error).
func (o *Operations) statBroken(path string) error {
	if _, err := o.stat(path); IsBrokenMount(err) {
		return err
	}
	return nil
}

// IsDeadMount says whether err, from a stat of a path, means that the
// mount's server is gone for good: ENOTCONN, or ECONNABORTED for a request
// in flight when it went (a FUSE daemon that died). Only such a mount is
// torn down before it is set up again: the other errors IsBrokenMount
// counts (EIO, ESTALE, EACCES, EWOULDBLOCK, ENODEV) may come from a
// mount that still serves a running pod — a transient I/O error, a FUSE
// mount without allow_other — and are left to the driver's set-up call,
// as before.
func IsDeadMount(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	return errno == syscall.ENOTCONN || errno == syscall.ECONNABORTED
}

// statDead stats path and returns the error when its mount is dead
// (IsDeadMount), nil otherwise.
func (o *Operations) statDead(path string) error {
	if _, err := o.stat(path); IsDeadMount(err) {
		return err
	}
	return nil
}

// makeMountDir creates a directory the driver mounts at. A directory that
// is a broken mount (ENOTCONN, EIO, ...: a FUSE driver's mount whose server
// died) exists, though MkdirAll cannot tell: it is left for the driver. A
// stage of a volume known to be staged there unstages it first (see
// repairStaging), so this happens only with a path nobody recorded.
func makeMountDir(path string) error {
	err := os.MkdirAll(path, checkpoint.DirMode)
	if err == nil {
		return nil
	}
	if _, statErr := os.Stat(path); IsBrokenMount(statErr) {
		return nil
	}
	return err
}

// ErrMountBroken is wrapped by the error recorded on a pod's use whose
// mount was found broken, while it is set up again.
var ErrMountBroken = errors.New("the volume's mount is broken")

// ErrBrokenMountStays is wrapped by the error of a repair whose teardown
// call succeeded but left the path a mount point (or still broken): the
// step is retried with backoff and nothing is recorded as torn down.
var ErrBrokenMountStays = errors.New("still a mount point after the teardown of a broken mount")

// The repair of a broken mount. Drivers do not replace a broken mount when
// they are asked to set it up again: a stock FUSE driver's NodePublishVolume
// stats its target first and fails on ENOTCONN forever, and
// csi-driver-host-path records a target a second time when it is published
// over (its one NodeUnpublishVolume then leaves a record, and every
// NodeUnstageVolume is refused). What they all handle is a teardown of the
// broken mount, as the kubelet's UnmountVolume sends it (CleanupMountPoint
// handles corrupted mounts). So a set-up at a path whose mount is dead
// (IsDeadMount), of a volume or use the agent recorded as set up (or
// uncertain), first tears it down: NodeUnpublishVolume of the target, or NodeUnpublishVolume
// of every target of the volume and then NodeUnstageVolume of the staging
// path; then the set-up runs as usual. The records (publish and staged
// records on disk, the actual state in memory) are kept throughout, with
// the state uncertain: an agent killed half-way finds them at restart and,
// the volume still wanted and its paths no longer mounted, sets it up
// again. An error of a teardown leaves the state uncertain and the set-up
// not called; the caller retries with backoff.

// unpublishBroken sends NodeUnpublishVolume for a target that is a broken
// mount and checks that the target is no longer a mount point. NotFound
// counts as success.
func (o *Operations) unpublishBroken(ctx context.Context, client DriverClient, handle, target string) error {
	if err := alreadyDone(client.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{
		VolumeId: handle, TargetPath: target,
	})); err != nil {
		return fmt.Errorf("unpublishing the broken mount at %s: %w", target, err)
	}
	return o.noLongerMounted(target)
}

// unstageBroken sends NodeUnstageVolume for a staging path that is a broken
// mount and checks that it is no longer a mount point.
func (o *Operations) unstageBroken(ctx context.Context, client DriverClient, handle, path string) error {
	if err := alreadyDone(client.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{
		VolumeId: handle, StagingTargetPath: path,
	})); err != nil {
		return fmt.Errorf("unstaging the broken mount at %s: %w", path, err)
	}
	return o.noLongerMounted(path)
}

// healthyMount says whether path is a mount point that answers a stat.
func (o *Operations) healthyMount(path string) bool {
	if _, err := o.stat(path); err != nil {
		return false
	}
	mounted, err := o.mounts.IsMountPoint(path)
	return err == nil && mounted
}

// noLongerMounted fails unless path is gone or is a healthy path that is
// not a mount point.
func (o *Operations) noLongerMounted(path string) error {
	if err := o.statBroken(path); err != nil {
		return fmt.Errorf("%s: %w (%w)", path, ErrBrokenMountStays, err)
	}
	mounted, err := mountedAt(o.mounts, path)
	if err != nil {
		return err
	}
	if mounted {
		return fmt.Errorf("%s: %w", path, ErrBrokenMountStays)
	}
	return nil
}
