package check

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/mountcheck"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// repairTimeout bounds the mount repair after a driver restart.
const repairTimeout = 15 * time.Second

// desired is the desired state the mount check reads: v wanted by pods.
type desired struct {
	v    *vol
	pods []int
}

func (d desired) Volume(name volume.Name) (volume.Source, bool) {
	return d.v.src, name == d.v.name
}

func (d desired) VolumePods(name volume.Name) []types.UID {
	if name != d.v.name {
		return nil
	}
	var out []types.UID
	for _, i := range d.pods {
		key, _ := pod(d.v, i)
		out = append(out, key.Pod)
	}
	return out
}

func (d desired) PodVolume(key volume.PodKey) (dsw.Use, bool) {
	for _, i := range d.pods {
		k, pv := pod(d.v, i)
		if k == key {
			return dsw.Use{Name: d.v.name, Source: d.v.src, Volume: pv}, true
		}
	}
	return dsw.Use{}, false
}

// repairMounts runs the agent's mount check (lifecycle/mountcheck) as on a
// driver's reconnection, publishing again what it hands back, as the
// reconciler does, until every path of v is usable. The repair is the
// agent's: a broken staging path is torn down (NodeUnpublishVolume of the
// targets, NodeUnstageVolume) and staged again, a broken target is
// unpublished and published again; the driver must tear down a broken mount
// and need not replace one when asked to set it up again.
func repairMounts(ctx context.Context, r *run, m *manager, v *vol, pods []int) error {
	ctx, cancel := context.WithTimeout(ctx, repairTimeout)
	defer cancel()
	d := desired{v: v, pods: pods}
	requeued := make(chan volume.PodKey, 16)
	chk, err := mountcheck.New(mountcheck.Config{
		State: m.world, Desired: d, Operations: m.ops,
		Requeue:      func(key volume.PodKey) { requeued <- key },
		ProbeTimeout: 5 * time.Second, RetryBaseDelay: 200 * time.Millisecond, RetryMaxDelay: 2 * time.Second,
	})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		chk.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	chk.DriverRegistered(v.src.Driver)
	var lastErr error
	// A failed publish is retried with the kubelet's backoff (RetryDelay,
	// doubling), as the reconciler's rate-limited queue does: right after
	// its restart a driver may not answer yet.
	delays := map[volume.PodKey]time.Duration{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case key := <-requeued:
			use, _ := d.PodVolume(key)
			if err := m.ops.Publish(ctx, key, v.src, use.Volume); err != nil {
				lastErr = err
				delay := delays[key]
				if delay == 0 {
					delay = r.cfg.RetryDelay
				}
				delays[key] = min(2*delay, repairTimeout)
				time.AfterFunc(delay, func() {
					select {
					case requeued <- key:
					case <-ctx.Done():
					}
				})
			}
		case <-tick.C:
			if bad := unusable(m, v, pods); len(bad) == 0 {
				return nil
			}
		case <-ctx.Done():
			got := "still broken: " + strings.Join(unusable(m, v, pods), "; ")
			if lastErr != nil {
				got += "; the last publish again (NodeUnpublishVolume, NodePublishVolume): " + describe(lastErr)
			}
			return fail("repairing the mounts after the driver restarted",
				"the staging path and the targets usable again once the broken mounts (ENOTCONN, EIO) are torn down and set up again at the same paths: "+
					"NodeUnpublishVolume of each target and NodeUnstageVolume succeed and leave no mount, then NodeStageVolume and NodePublishVolume mount again", got)
		}
	}
}

// unusable lists the paths of v that cannot be used.
func unusable(m *manager, v *vol, pods []int) []string {
	var bad []string
	var paths []string
	if sp := m.stagingPath(v); sp != "" {
		paths = append(paths, sp)
	}
	for _, i := range pods {
		key, _ := pod(v, i)
		if p, ok := m.world.Pod(key); ok {
			paths = append(paths, p.TargetPath)
			if p.State != volume.Published {
				bad = append(bad, fmt.Sprintf("pod-%d's publish is %v", i, p.State))
			}
		}
	}
	for _, p := range paths {
		if _, err := os.ReadDir(p); err != nil {
			bad = append(bad, err.Error())
		}
	}
	return bad
}
