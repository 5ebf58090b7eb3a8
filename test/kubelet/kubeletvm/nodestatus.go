package kubeletvm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	nodeutil "k8s.io/component-helpers/node/util"
	"k8s.io/kubernetes/pkg/kubelet/nodestatus"
)

// nodeStatusUpdateRetry is the kubelet's (pkg/kubelet/kubelet.go).
const nodeStatusUpdateRetry = 5

// nodeStatusLoop stands in for the kubelet's node status loop as far as
// volumes go: every NodeStatusUpdateFrequency (jittered by 0.04) it runs
// tryUpdateNodeStatus with only the real VolumesInUse setter
// (pkg/kubelet/nodestatus) of the kubelet's many: the first try reads the
// Node from the informer, later tries GET it; the status is patched (the
// kubelet's nodeutil.PatchNodeStatus) when volumesInUse changed or
// NodeStatusReportFrequency (plus the kubelet's random delay) passed; and
// then the volume manager is told what the Node reports in use
// (MarkVolumesAsReportedInUse), which the reconciler waits for before it
// verifies that an attachable volume is attached. Conditions, addresses,
// capacity, images and the node lease are not written.
//
// volumesAttached, which VerifyControllerAttachedVolume reads from the
// Node, is the attach/detach controller's: nothing here writes it (the
// benchmarks write it as the controller would).
func (k *Kubelet) nodeStatusLoop(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), k.nodeSynced) {
		return
	}
	s := &nodeStatusSyncer{k: k, setter: nodestatus.VolumesInUse(k.vm.ReconcilerStatesHasBeenSynced, k.vm.GetVolumesInUse)}
	wait.JitterUntilWithContext(ctx, s.sync, k.cfg.Kubelet.NodeStatusUpdateFrequency.Duration, 0.04, true)
}

type nodeStatusSyncer struct {
	k                *Kubelet
	setter           nodestatus.Setter
	lastReport       time.Time
	delayAfterChange time.Duration
}

func (s *nodeStatusSyncer) sync(ctx context.Context) {
	for i := range nodeStatusUpdateRetry {
		err := s.try(ctx, i)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.k.logger.Error(err, "Error updating node status, will retry")
	}
}

// try is tryUpdateNodeStatus with the VolumesInUse setter alone.
func (s *nodeStatusSyncer) try(ctx context.Context, try int) error {
	k := s.k
	var original *corev1.Node
	var err error
	if try == 0 {
		original, err = k.nodeLister.Get(k.cfg.NodeName)
	} else {
		original, err = k.cfg.HeartbeatClient.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("error getting node %q: %w", k.cfg.NodeName, err)
	}
	if original == nil {
		return errors.New("nil node")
	}
	node := original.DeepCopy()
	if err := s.setter(ctx, node); err != nil {
		return err
	}
	changed := !apiequality.Semantic.DeepEqual(original.Status.VolumesInUse, node.Status.VolumesInUse)
	report := k.cfg.Kubelet.NodeStatusReportFrequency.Duration
	if !changed && time.Since(s.lastReport) < report+s.delayAfterChange {
		k.vm.MarkVolumesAsReportedInUse(node.Status.VolumesInUse)
		return nil
	}
	if changed || s.lastReport.IsZero() {
		s.delayAfterChange = time.Duration(float64(report) * (-0.5 + rand.Float64()))
	} else {
		s.delayAfterChange = 0
	}
	updated, _, err := nodeutil.PatchNodeStatus(k.cfg.HeartbeatClient.CoreV1(), types.NodeName(k.cfg.NodeName), original, node)
	if err != nil {
		return err
	}
	s.lastReport = time.Now()
	k.vm.MarkVolumesAsReportedInUse(updated.Status.VolumesInUse)
	return nil
}
