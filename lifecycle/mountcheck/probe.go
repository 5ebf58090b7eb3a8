package mountcheck

import (
	"context"
	"errors"
	"io/fs"
	"time"

	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
)

// probe says why path is broken, "" when it is healthy or cannot be told
// (the probe timed out, or a path that need not be a mount point never was
// one). mustMount says the path must be a mount point whatever was seen
// before.
func (c *Checker) probe(ctx context.Context, path string, mustMount bool) string {
	c.mu.Lock()
	if c.probing[path] {
		c.mu.Unlock()
		return "" // an earlier probe still hangs: leave it
	}
	c.probing[path] = true
	wasMounted, known := c.mounted[path]
	c.mu.Unlock()

	type result struct {
		statErr error
		mounted bool
		mntErr  error
	}
	done := make(chan result, 1)
	timeout := time.NewTimer(c.cfg.ProbeTimeout)
	defer timeout.Stop()
	select {
	case c.sem <- struct{}{}:
	case <-timeout.C:
		// Every slot is held by a probe that hangs (a dead network mount):
		// leave this path for the next check.
		c.mu.Lock()
		delete(c.probing, path)
		c.mu.Unlock()
		return ""
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.probing, path)
		c.mu.Unlock()
		return ""
	}
	go func() {
		var r result
		if _, r.statErr = operations.StatMount(path); r.statErr == nil {
			r.mounted, r.mntErr = c.mounts.IsMountPoint(path)
		}
		// Done with the path before the result is told: a check right
		// after this one must probe it again, not take it for a probe
		// that still hangs.
		<-c.sem
		c.mu.Lock()
		delete(c.probing, path)
		c.mu.Unlock()
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case <-timeout.C:
		klog.FromContext(ctx).Info("Probing a mount timed out; leaving it alone", "path", path, "timeout", c.cfg.ProbeTimeout)
		return ""
	case <-ctx.Done():
		return ""
	}
	switch {
	case operations.IsBrokenMount(r.statErr):
		return reasonCorrupted + " (" + r.statErr.Error() + ")"
	case errors.Is(r.statErr, fs.ErrNotExist):
		return reasonMissing
	case r.statErr != nil || r.mntErr != nil:
		return ""
	case !r.mounted && (mustMount || (known && wasMounted)):
		return reasonNotMounted
	}
	c.mu.Lock()
	c.mounted[path] = r.mounted
	c.mu.Unlock()
	return ""
}
