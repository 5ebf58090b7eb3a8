package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
)

// FuseParameter is the CreateVolume parameter (and so the volume context key) that makes a filesystem
// volume FUSE-backed: NodeStageVolume mounts a FUSE file system served by the plugin process itself
// (a loopback of the volume's directory) at the staging path, and NodePublishVolume bind-mounts it
// to the target. When the plugin process dies, the kernel aborts its FUSE connection and every one of
// those mounts answers "transport endpoint is not connected" (ENOTCONN), as the mounts of ceph-fuse,
// mountpoint-s3 or gcsfuse do when their node plugin restarts (kubernetes#96361). A new plugin
// process does not revive them: a NodeStageVolume and NodePublishVolume repeated at the same paths do,
// by replacing the broken mounts.
const FuseParameter = "testplugin.csi-volmgr.io/fuse"

// fuseName is the file system name of the plugin's FUSE mounts: their type is "fuse.csitestplugin".
const fuseName = "csitestplugin"

// fuseType is the mount table's type of the plugin's FUSE mounts.
const fuseType = "fuse." + fuseName

// fuseSourcePrefix starts the mount source of a FUSE mount: "csitp:<volume ID>".
const fuseSourcePrefix = "csitp:"

// fuseSource is the mount source of the FUSE mount of volume id.
func fuseSource(id string) string { return fuseSourcePrefix + id }

// isFuse reports whether the volume is FUSE-backed.
func isFuse(v *Volume) bool {
	return v.AccessType == AccessMount && v.Parameters[FuseParameter] == "true"
}

// fuseServers are the FUSE file systems this plugin process serves, by mount point.
type fuseServers struct {
	// size returns the size of a volume's file system, which statfs of its FUSE mounts reports.
	size func(id string) int64

	mu      sync.Mutex
	servers map[string]*fuse.Server
}

// fuseMountAt returns the mount table entry of a FUSE mount of volume id at path (the top one), nil
// when path is not such a mount. The entry is read from the mount table, so a broken mount (its
// plugin process gone) is found as well.
func fuseMountAt(path, id string) (*mountinfo.Info, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].FSType == fuseType && mounts[i].Source == fuseSource(id) {
			return mounts[i], nil
		}
	}
	return nil, nil
}

// mount serves a loopback of the volume's directory over FUSE at path, replacing a broken FUSE mount
// of the volume that a dead plugin process left there. A healthy mount is kept. keepBroken
// (BugKeepBrokenMount) keeps a broken one too; unchecked (BugStageUncheckedMount) mounts without
// looking at what is mounted there.
func (f *fuseServers) mount(logger klog.Logger, v *Volume, path string, keepBroken, unchecked bool) error {
	m, err := fuseMountAt(path, v.ID)
	if err != nil {
		return err
	}
	if m != nil && keepBroken {
		logger.Info("Bug keep-broken-mount: keeping whatever FUSE mount is there", "path", path)
		return nil
	}
	if m != nil && !unchecked {
		_, statErr := os.Stat(path)
		if statErr == nil {
			logger.V(4).Info("FUSE file system already mounted", "path", path)
			return nil
		}
		if !mount.IsCorruptedMnt(statErr) {
			return fmt.Errorf("stat %s: %w", path, statErr)
		}
		logger.Info("Replacing a broken FUSE mount", "path", path, "err", statErr)
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount broken FUSE mount %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(path, 0o750); err != nil {
		return fmt.Errorf("create directory %s: %w", path, err)
	}
	root, err := f.newRoot(v)
	if err != nil {
		return fmt.Errorf("serve %s over FUSE: %w", v.Path, err)
	}
	srv, err := fs.Mount(path, root, &fs.Options{MountOptions: fuse.MountOptions{
		DirectMountStrict: true, // as root, with mount(2): there is no fusermount here
		AllowOther:        true,
		FsName:            fuseSource(v.ID),
		Name:              fuseName,
	}})
	if err != nil {
		return fmt.Errorf("mount FUSE file system at %s: %w", path, err)
	}
	f.mu.Lock()
	if f.servers == nil {
		f.servers = map[string]*fuse.Server{}
	}
	f.servers[path] = srv
	f.mu.Unlock()
	go func() {
		srv.Wait()
		f.mu.Lock()
		if f.servers[path] == srv {
			delete(f.servers, path)
		}
		f.mu.Unlock()
	}()
	logger.V(4).Info("Mounted FUSE file system", "path", path, "source", v.Path)
	return nil
}

// unmountFuse unmounts every FUSE mount of volume id stacked at path, broken or not.
func unmountFuse(logger klog.Logger, path, id string) error {
	for {
		m, err := fuseMountAt(path, id)
		if err != nil || m == nil {
			return err
		}
		if err := unix.Unmount(path, 0); err != nil {
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount FUSE mount %s: %w", path, err)
			}
		}
		logger.V(4).Info("Unmounted FUSE mount", "path", path)
	}
}

// checkFuseStaged reports nil when staging is a working FUSE mount of the volume, the broken-mount
// error when it is a broken one, and FailedPrecondition-worthy errStagingMissing otherwise.
func checkFuseStaged(staging, id string) error {
	m, err := fuseMountAt(staging, id)
	if err != nil {
		return err
	}
	if m == nil {
		return errStagingMissing
	}
	if _, err := os.Stat(staging); err != nil {
		return fmt.Errorf("staging path %s: %w", staging, err)
	}
	return nil
}

// errStagingMissing means the staging path does not show the volume.
var errStagingMissing = errors.New("staging path does not show the volume")

// replaceBrokenMount lazily unmounts path when it is a mount point that answers with a broken-mount
// error (ENOTCONN, EIO, ESTALE, ...), so that a repeated NodeStageVolume or NodePublishVolume can mount
// again. A healthy or missing path is left as it is.
func replaceBrokenMount(logger klog.Logger, path string) error {
	_, err := os.Stat(path)
	if err == nil || !mount.IsCorruptedMnt(err) {
		return nil
	}
	logger.Info("Unmounting a broken mount before mounting again", "path", path, "err", err)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount broken mount %s: %w", path, err)
	}
	return nil
}

// isBrokenMount says whether err, from a stat, means a broken mount: mount-utils' IsCorruptedMnt,
// or ECONNABORTED (a FUSE request in flight when the daemon died).
func isBrokenMount(err error) bool {
	return mount.IsCorruptedMnt(err) || errors.Is(err, unix.ECONNABORTED)
}

// fuseMountsOf lists the mount points of the plugin's FUSE mounts of the volumes in ids, deepest
// first; for test cleanup.
func fuseMountsOf(ids map[string]bool) ([]string, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter(fuseType))
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	var out []string
	for _, m := range mounts {
		if id, ok := strings.CutPrefix(m.Source, fuseSourcePrefix); ok && ids[id] {
			out = append(out, m.Mountpoint)
		}
	}
	return out, nil
}

// sizedRoot is the root of a FUSE volume: a loopback of its directory whose statfs reports the
// volume's size (the file system a block-backed driver would have made, grown by NodeExpandVolume)
// rather than the size of the file system that holds the directory.
type sizedRoot struct {
	*fs.LoopbackNode
	size func() int64
}

var _ = (fs.NodeStatfser)((*sizedRoot)(nil))

// Statfs reports the volume's size as the blocks, the free blocks of the file system below capped by it.
func (n *sizedRoot) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if errno := n.LoopbackNode.Statfs(ctx, out); errno != 0 {
		return errno
	}
	bsize := uint64(out.Bsize)
	if bsize == 0 {
		bsize = 4096
		out.Bsize = uint32(bsize)
	}
	if size := n.size(); size > 0 {
		out.Blocks = uint64(size) / bsize
		out.Bfree, out.Bavail = min(out.Bfree, out.Blocks), min(out.Bavail, out.Blocks)
	}
	return fs.OK
}

// newRoot returns the root node of v's FUSE file system.
func (f *fuseServers) newRoot(v *Volume) (fs.InodeEmbedder, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(v.Path, &st); err != nil {
		return nil, err
	}
	id := v.ID
	r := &fs.LoopbackRoot{Path: v.Path, Dev: st.Dev}
	root := &sizedRoot{LoopbackNode: &fs.LoopbackNode{RootData: r}, size: func() int64 {
		if f.size == nil {
			return 0
		}
		return f.size(id)
	}}
	r.RootNode = root
	return root, nil
}
