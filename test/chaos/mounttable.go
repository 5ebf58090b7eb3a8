package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// mountInfoPath is the real mount table, as the processes of the node see it.
const mountInfoPath = "/proc/self/mountinfo"

// parseMountInfo returns the mount points of a mountinfo table below prefix (a directory with
// its trailing slash).
func parseMountInfo(data []byte, prefix string) (map[string]bool, error) {
	out := map[string]bool{}
	for line := range bytes.SplitSeq(data, []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		fields := strings.Fields(string(line))
		if len(fields) < 5 {
			return nil, fmt.Errorf("mountinfo: short line %q", line)
		}
		mp, err := unescapeMountPath(fields[4])
		if err != nil {
			return nil, fmt.Errorf("mountinfo: %w in %q", err, line)
		}
		if strings.HasPrefix(mp, prefix) {
			out[mp] = true
		}
	}
	return out, nil
}

// unescapeMountPath undoes the kernel's octal escapes (\040 for a space, ...).
func unescapeMountPath(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			n, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
			if err != nil {
				return "", fmt.Errorf("bad escape in %q", s)
			}
			b.WriteByte(byte(n))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), nil
}

// readMountTable reads the mount points below prefix from the real mount table.
func readMountTable(prefix string) (map[string]bool, error) {
	data, err := os.ReadFile(mountInfoPath)
	if err != nil {
		return nil, err
	}
	return parseMountInfo(data, prefix)
}

// unmountedSince lists the mount points of prev that cur no longer has, sorted.
func unmountedSince(prev, cur map[string]bool) []string {
	var out []string
	for mp := range prev {
		if !cur[mp] {
			out = append(out, mp)
		}
	}
	slices.Sort(out)
	return out
}

// mountWatchFallback is how often the watch reads the mount table when poll(2) reports
// nothing: the kernel wakes it on every change of the mount namespace, this is only in case.
const mountWatchFallback = 100 * time.Millisecond

// watchMounts follows the mount table below the agent's root until ctx ends and tells the
// checker of every mount point that disappears (InvUnmountLive). poll(2) on
// /proc/self/mountinfo wakes with POLLPRI|POLLERR on every change of the mount table; the table
// is read again then, and every mountWatchFallback anyway. A mount that appears and disappears
// between two reads is not seen. A read error counts as a sampler error.
func (h *Harness) watchMounts(ctx context.Context) {
	prefix := h.agent.RootDir + "/"
	f, err := os.Open(mountInfoPath)
	if err != nil {
		h.stats.samplerError()
		h.logf("chaos: watching the mount table: %v", err)
		return
	}
	defer func() { _ = f.Close() }()
	read := func() (map[string]bool, error) {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, err
		}
		data, err := io.ReadAll(f)
		if err != nil {
			return nil, err
		}
		return parseMountInfo(data, prefix)
	}
	prev, err := read()
	if err != nil {
		h.stats.samplerError()
		h.logf("chaos: reading the mount table: %v", err)
		return
	}
	for ctx.Err() == nil {
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI | unix.POLLERR}}
		if _, err := unix.Poll(fds, int(mountWatchFallback/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			h.stats.samplerError()
			h.logf("chaos: poll on the mount table: %v", err)
			time.Sleep(mountWatchFallback)
		}
		cur, err := read()
		now := time.Now()
		if err != nil {
			h.stats.samplerError()
			h.logf("chaos: reading the mount table: %v", err)
			continue
		}
		for _, mp := range unmountedSince(prev, cur) {
			h.checker.Unmounted(mp, now)
		}
		prev = cur
	}
}

// Unmounts says how many mount points the mount-table watch saw leave.
func (c *Checker) Unmounts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unmounts
}

// Unmounted checks a mount point that left the mount table at t (InvUnmountLive): the target,
// block map bind mount or subPath mount of a pod live at t, or the staging mount of a volume a
// pod live at t wants, where the pod was created long enough ago for the agent to know of it
// (the checker's slack, with the API server up all that time).
func (c *Checker) Unmounted(path string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unmounts++
	if ref, ok := c.targets[path]; ok {
		if p := c.pods[ref.uid]; p != nil && p.live(t) {
			c.violateLocked(InvUnmountLive, t, "the target %s of %s of live pod %s left the mount table", path, ref.vol, p.Name)
		}
		return
	}
	if ref, ok := c.mapFiles[path]; ok {
		if p := c.pods[ref.uid]; p != nil && p.live(t) {
			c.violateLocked(InvUnmountLive, t, "the block map bind mount %s of %s of live pod %s left the mount table", path, ref.vol, p.Name)
		}
		return
	}
	if k, ok := c.stagingMounts[path]; ok {
		for _, p := range c.pods {
			if !p.live(t) || !slices.ContainsFunc(p.Volumes, func(v PodVolume) bool { return v.Vol == k }) {
				continue
			}
			if p.Created.Add(c.slack).Before(t) && c.apiUpLocked(p.Created, p.Created.Add(c.slack)) {
				c.violateLocked(InvUnmountLive, t, "the staging mount %s of %s left the mount table while live pod %s, created %s, wants it",
					path, k, p.Name, stamp(p.Created))
			}
		}
		return
	}
	for dir := filepath.Dir(path); dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		if ref, ok := c.subPaths[dir]; ok {
			if p := c.pods[ref.uid]; p != nil && p.live(t) {
				c.violateLocked(InvUnmountLive, t, "the subPath mount %s of %s of live pod %s left the mount table", path, ref.vol, p.Name)
			}
			return
		}
	}
}
