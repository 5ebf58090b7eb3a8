package check

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconstruct"
)

// reconstructInto rebuilds m's actual state from the records under the
// root, as the agent does at start.
func reconstructInto(ctx context.Context, m *manager) error {
	_, err := reconstruct.Run(ctx, m.ops.Layout(), mount.New(""), m.world)
	return err
}

// mountTable reads the mount table with the parser the agent uses
// (mount-utils').
func mountTable() ([]mount.MountInfo, error) {
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	return infos, nil
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	infos, err := mountTable()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range infos {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, strings.TrimSuffix(dir, "/")+"/") {
			out = append(out, m.MountPoint)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return slices.Compact(out), nil
}

// mountCount counts the mounts stacked at path.
func mountCount(path string) (int, error) {
	infos, err := mountTable()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range infos {
		if m.MountPoint == path {
			n++
		}
	}
	return n, nil
}

// sweep removes what is left below dir after the teardown: mounts
// (unmounted lazily) and loop devices over files below dir. It reports
// each, since a teardown that went right leaves none.
func sweep(_ context.Context, dir string) []string {
	var problems []string
	mps, err := mountsUnder(dir)
	if err != nil {
		return []string{err.Error()}
	}
	for _, mp := range mps {
		for {
			n, err := mountCount(mp)
			if err != nil || n == 0 {
				break
			}
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
				problems = append(problems, fmt.Sprintf("%s is left mounted and cannot be unmounted: %v", mp, err))
				break
			}
			problems = append(problems, fmt.Sprintf("%s was left mounted; unmounted it", mp))
		}
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if dev, err := loopdev.Find(p); err == nil && dev != "" {
			if err := loopdev.Detach(p); err != nil {
				problems = append(problems, fmt.Sprintf("loop device %s over %s is left and cannot be detached: %v", dev, p, err))
			} else {
				problems = append(problems, fmt.Sprintf("loop device %s over %s was left; detached it", dev, p))
			}
		}
		return nil
	})
	return problems
}

// removeRoot removes dir, which must hold no mount any more: RemoveAll
// would otherwise delete the volume's data through it.
func removeRoot(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("not removing %s: %v still mounted below it", dir, mps)
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
