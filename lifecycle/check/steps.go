package check

import (
	"context"
	"fmt"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Steps with their failures.

func (r *run) stage(ctx context.Context, m *manager, v *vol, fsGroup *int64, step string) error {
	if err := m.stage(ctx, v, fsGroup); err != nil {
		return fail(step, expectStage, err)
	}
	return r.stagedOnce(m, v, step)
}

// stagedOnce checks that at most one mount is at the staging path.
func (r *run) stagedOnce(m *manager, v *vol, step string) error {
	if v.src.Inline {
		return nil // never staged
	}
	if n, err := mountCount(m.stagingPath(v)); err != nil {
		return err
	} else if n > 1 {
		return fail(step, "one mount at the staging path: NodeStageVolume is idempotent, a repeated call must not mount again",
			fmt.Sprintf("%d mounts stacked at %s", n, m.stagingPath(v)))
	}
	return nil
}

func (r *run) publish(ctx context.Context, m *manager, v *vol, key volume.PodKey, pv volume.PodVolume, step string) (string, error) {
	if err := m.ops.Publish(ctx, key, v.src, pv); err != nil {
		return "", fail(step, expectPublish, err)
	}
	target, err := m.target(key)
	if err != nil {
		return "", err
	}
	if v.src.AccessType == volume.Filesystem {
		if n, err := mountCount(target); err != nil {
			return "", err
		} else if n != 1 {
			return "", fail(step, "the target path mounted once (the kubelet hands it to the pod as it is)",
				fmt.Sprintf("%d mounts at %s", n, target))
		}
	}
	return target, nil
}

func (r *run) unpublish(ctx context.Context, m *manager, key volume.PodKey, step string) error {
	p, _ := m.world.Pod(key)
	if err := m.ops.Unpublish(ctx, key); err != nil {
		return fail(step, expectUnpublish, err)
	}
	if p.TargetPath != "" {
		if n, err := mountCount(p.TargetPath); err != nil {
			return err
		} else if n > 0 {
			return fail(step, expectUnpublish, fmt.Sprintf("%d mounts left at %s", n, p.TargetPath))
		}
	}
	return nil
}

func (r *run) unstage(ctx context.Context, m *manager, v *vol, step string) error {
	if v.src.Inline {
		return nil // never staged
	}
	if err := m.ops.Unstage(ctx, v.name); err != nil {
		return fail(step, expectUnstage, err)
	}
	if n, err := mountCount(m.stagingPath(v)); err != nil {
		return err
	} else if n > 0 {
		return fail(step, expectUnstage, fmt.Sprintf("%d mounts left at %s", n, m.stagingPath(v)))
	}
	return nil
}

// setup makes a manager and a volume staged and published for the pods
// given, returning their targets.
func (r *run) setup(ctx context.Context, access volume.AccessType, pods ...int) (*manager, *vol, []string, error) {
	m, v, err := r.managerAndVolume(ctx, access)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := r.stage(ctx, m, v, nil, "stage"); err != nil {
		return nil, nil, nil, err
	}
	var targets []string
	for _, i := range pods {
		key, pv := pod(v, i)
		t, err := r.publish(ctx, m, v, key, pv, fmt.Sprintf("publish for pod-%d", i))
		if err != nil {
			return nil, nil, nil, err
		}
		targets = append(targets, t)
	}
	return m, v, targets, nil
}

// managerAndVolume starts a volume manager and creates a volume of the
// access type.
func (r *run) managerAndVolume(ctx context.Context, access volume.AccessType) (*manager, *vol, error) {
	m, err := r.newManager()
	if err != nil {
		return nil, nil, err
	}
	v, err := r.newVolume(ctx, access)
	if err != nil {
		return nil, nil, err
	}
	return m, v, nil
}

// restage stages v again on m and publishes it for pod i: the steps after
// a volume manager restart or a teardown. It returns pod i's target.
func (r *run) restage(ctx context.Context, m *manager, v *vol, i int, stageStep, publishStep string) (string, error) {
	if err := r.stage(ctx, m, v, nil, stageStep); err != nil {
		return "", err
	}
	key, pv := pod(v, i)
	return r.publish(ctx, m, v, key, pv, publishStep)
}

// teardownAll unpublishes the pods given and unstages.
func (r *run) teardownAll(ctx context.Context, m *manager, v *vol, pods ...int) error {
	for _, i := range pods {
		key, _ := pod(v, i)
		if err := r.unpublish(ctx, m, key, fmt.Sprintf("unpublish for pod-%d", i)); err != nil {
			return err
		}
	}
	return r.unstage(ctx, m, v, "unstage")
}
