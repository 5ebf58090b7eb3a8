package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
)

// cleanupPasses bounds the unmount passes; each pass removes one layer of stacked mounts.
const cleanupPasses = 16

type fileID struct {
	dev uint64
	ino uint64
}

// CleanupMounts unmounts every mount, anywhere in the mount namespace, that shows a volume of the
// plugin whose state directory is stateDir (FUSE mounts of its volumes included, broken or not), and detaches the volumes' loop devices. It is meant for
// test teardown once the plugin process is gone: it finds the mounts in the mount table and the
// volumes in the volumes directory, not in the state file, so it works whatever the plugin died doing.
func CleanupMounts(stateDir string) error {
	resolved, err := filepath.EvalSymlinks(stateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("resolve state directory: %w", err)
	}
	volumesDir := filepath.Join(resolved, volumesDirName)
	entries, err := os.ReadDir(volumesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}

	// What a mount of each volume shows: its directory, or its loop device.
	sources := map[fileID]bool{}
	ids := map[string]bool{}
	var images []string
	for _, e := range entries {
		ids[strings.TrimSuffix(e.Name(), ".img")] = true
		p := filepath.Join(volumesDir, e.Name())
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".img") {
			images = append(images, p)
			if p, err = loopdev.Find(p); err != nil {
				continue
			}
		}
		if id, err := statID(p); err == nil {
			sources[id] = true
		}
	}

	var errs []error
	for range cleanupPasses {
		ours, err := mountsShowing(sources)
		if err != nil {
			return err
		}
		fuseMounts, err := fuseMountsOf(ids)
		if err != nil {
			return err
		}
		ours = append(fuseMounts, ours...)
		if len(ours) == 0 {
			break
		}
		for _, p := range ours {
			if err := unix.Unmount(p, 0); err != nil {
				if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
					errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
				}
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
	}
	for _, img := range images {
		if err := loopdev.Detach(img); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountsShowing lists the mount points whose root is one of sources, deepest first.
func mountsShowing(sources map[fileID]bool) ([]string, error) {
	devs := map[[2]uint32]bool{}
	for id := range sources {
		devs[[2]uint32{unix.Major(id.dev), unix.Minor(id.dev)}] = true
	}
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !devs[[2]uint32{uint32(m.Major), uint32(m.Minor)}], false
	})
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range mounts {
		if id, err := statID(m.Mountpoint); err == nil && sources[id] && !seen[m.Mountpoint] {
			seen[m.Mountpoint] = true
			out = append(out, m.Mountpoint)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

func statID(p string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}
