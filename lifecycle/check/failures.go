package check

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// The scenarios of failures the kubelet lives through: an uncertain
// stage, the volume manager killed between steps, the driver restarted.

func uncertainStage(ctx context.Context, r *run) error {
	m, v, err := r.managerAndVolume(ctx, volume.Filesystem)
	if err != nil {
		return err
	}
	r.rec.interfere("NodeStageVolume", withhold)
	if err := m.stage(ctx, v, nil); err == nil {
		return errors.New("the held NodeStageVolume did not fail")
	}
	if st, _ := m.world.Volume(v.name); st.Stage != volume.StageUncertain {
		return fmt.Errorf("the held NodeStageVolume left the volume %v, not uncertain", st.Stage)
	}
	if err := sleep(ctx, r.cfg.RetryDelay); err != nil {
		return err
	}
	if err := r.stage(ctx, m, v, nil, "NodeStageVolume retried after the uncertain one"); err != nil {
		return err
	}
	key, pv := pod(v, 0)
	target, err := r.publish(ctx, m, v, key, pv, "publish right after the retried stage answered OK")
	if err != nil {
		var f *failure
		if errors.As(err, &f) {
			f.expected += ": a NodeStageVolume answers OK only once the volume is staged, also while an earlier call for it still runs"
		}
		return err
	}
	data := randomData(4096)
	if err := writeData(target, data); err != nil {
		return fail("writing through the target", "a writable volume", err)
	}
	return r.teardownAll(ctx, m, v, 0)
}

// crashAndRestart runs steps on a new volume for pod 0 in a volume
// manager process that is then SIGKILLed, and returns the volume manager
// started after it, its actual state rebuilt from the records.
func (r *run) crashAndRestart(ctx context.Context, steps ...string) (*manager, *vol, error) {
	v, err := r.newVolume(ctx, volume.Filesystem)
	if err != nil {
		return nil, nil, err
	}
	if _, err := r.crash(ctx, v, 0, steps); err != nil {
		return nil, nil, err
	}
	if err := sleep(ctx, r.cfg.RestartDelay); err != nil {
		return nil, nil, err
	}
	m, err := r.newManager()
	if err != nil {
		return nil, nil, err
	}
	if err := reconstructInto(ctx, m); err != nil {
		return nil, nil, err
	}
	if _, ok := m.world.Volume(v.name); !ok && !v.src.Inline { // an inline volume has no stage to record
		return nil, nil, errors.New("the restarted volume manager found no record of the stage")
	}
	return m, v, nil
}

func crashAfterStage(ctx context.Context, r *run) error {
	m, v, err := r.crashAndRestart(ctx, "stage")
	if err != nil {
		return err
	}
	target, err := r.restage(ctx, m, v, 0, "stage again by the restarted volume manager", "publish by the restarted volume manager")
	if err != nil {
		return err
	}
	if err := writeData(target, randomData(4096)); err != nil {
		return fail("writing through the target", "a writable volume", err)
	}
	return r.teardownAll(ctx, m, v, 0)
}

func crashAfterUnpublish(ctx context.Context, r *run) error {
	m, v, err := r.crashAndRestart(ctx, "stage", "publish", "unpublish")
	if err != nil {
		return err
	}
	// The pod is gone: whatever publish the records still show is torn down.
	for _, vs := range m.world.Snapshot() {
		for _, p := range vs.Pods {
			if err := r.unpublish(ctx, m, p.Key, "unpublish repeated by the restarted volume manager"); err != nil {
				return err
			}
		}
	}
	return r.unstage(ctx, m, v, "unstage by the restarted volume manager")
}

func driverRestart(ctx context.Context, r *run) error {
	pods := []int{0, 1}
	if r.cfg.Ephemeral {
		pods = []int{0} // an inline volume is one pod's own
	}
	m, v, targets, err := r.setup(ctx, volume.Filesystem, pods...)
	if err != nil {
		return err
	}
	// What the pods must see after the repair: the data written through
	// pod-0, or, in a read-only volume, the files the driver put there.
	var data []byte
	var files map[string]string
	if v.readOnly {
		if files, err = readTree(targets[0]); err != nil {
			return fail("reading pod-0's read-only target", "the files the driver put into the volume", err)
		}
	} else {
		data = randomData(4096)
		if err := writeData(targets[0], data); err != nil {
			return fail("writing through pod-0's target", "a writable volume", err)
		}
	}
	start := time.Now()
	if err := r.proc.kill(); err != nil {
		return fail("killing the driver", "every process of --driver-command gone after SIGKILL, as a container runtime waits for them", err)
	}
	if err := r.proc.start(ctx); err != nil {
		return fail("restarting the driver", "the driver serving again", err)
	}
	r.rec.add(Call{Method: "(driver restart)", Code: "-", Duration: time.Since(start), Note: "SIGKILL, then --driver-command again"})
	if err := r.reconnected(ctx); err != nil {
		return err
	}
	paths := targets
	if sp := m.stagingPath(v); sp != "" {
		paths = append([]string{sp}, targets...)
	}
	var broken []string
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			broken = append(broken, fmt.Sprintf("%s: %v", p, errors.Unwrap(err)))
		}
	}
	if len(broken) > 0 {
		r.rec.add(Call{Method: "(mount probe)", Code: "-", Note: "broken after the restart: " + strings.Join(broken, "; ")})
	}
	if err := repairMounts(ctx, r, m, v, pods); err != nil {
		return err
	}
	for i, t := range targets {
		if v.readOnly {
			if what := sameTree(t, files); what != "" {
				return fail(fmt.Sprintf("reading through pod-%d's read-only target after the repair", i), "the files the driver put into the volume before it restarted", what)
			}
			continue
		}
		if what := checkData(t, data); what != "" {
			return fail(fmt.Sprintf("reading through pod-%d's target after the repair", i), "the data written before the driver restarted", what)
		}
	}
	slices.Reverse(pods)
	return r.teardownAll(ctx, m, v, pods...)
}

// reconnected waits until the driver answers GetPluginInfo again on the
// check's connection, as the agent confirms a driver whose connection came
// back before it probes its mounts (driver/registry): the first call after
// a restart may meet the dead transport (Unavailable), which gRPC then
// replaces.
func (r *run) reconnected(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := r.client.GetPluginInfo(ctx)
		if err == nil {
			return nil
		}
		if serr := sleep(ctx, 100*time.Millisecond); serr != nil {
			return fail("the restarted driver", "GetPluginInfo to answer on the connection again within 30s", err)
		}
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
