package reconciler

import (
	"context"
	"fmt"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// MountExpander completes a publish by growing the volume's file system
// when its claim was resized while no pod used it (the kubelet expands
// during MountVolume); *expand.Expander implements it. Nil expands
// nothing.
type MountExpander interface {
	// ExpandAfterPublish expands the just-published volume if its claim
	// asks for more than it has. On failure the publish is left
	// uncertain (the pod is not ready and the publish is repeated).
	ExpandAfterPublish(ctx context.Context, key volume.PodKey, use dsw.Use) error
}

// expandAfterPublish runs the MountExpander after a successful publish and
// reports its failure on the pod.
func (r *Reconciler) expandAfterPublish(ctx context.Context, key volume.PodKey, use dsw.Use) error {
	if r.cfg.Expander == nil {
		return nil
	}
	if err := r.cfg.Expander.ExpandAfterPublish(ctx, key, use); err != nil {
		r.recordFailure(key.Volume, volume.StepExpand, err, key.Pod)
		return fmt.Errorf("expand %s after publish: %w", key, err)
	}
	return nil
}
