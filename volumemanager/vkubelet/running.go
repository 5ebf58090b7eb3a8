package vkubelet

import (
	"context"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// DefaultRunningPodsPeriod is how often ReportRunningPods reports.
const DefaultRunningPodsPeriod = 10 * time.Second

// RunningPodsReporter is what ReportRunningPods tells;
// *volumemanager.VolumeManager implements it.
type RunningPodsReporter interface {
	// BeginRunningPods dates a report before the pods are listed; the
	// returned function takes the list.
	BeginRunningPods() func(uids []types.UID)
}

// ReportRunningPods tells the volume manager, every period (0 means
// DefaultRunningPodsPeriod) until ctx ends, which pods the provider still
// runs: its GetPods, less the pods whose status says their containers are
// done. It is the kubelet's "ask the runtime" step: a pod force-deleted
// from the API server keeps its volumes until a report without it (or
// DeletePod's ContainersStopped). The pod handler of NewPodHandler reports
// once after each DeletePod too. Run it beside the pod controller, with
// the provider or the handler that wraps it; it returns when ctx ends.
func ReportRunningPods(ctx context.Context, provider node.PodLifecycleHandler, vm RunningPodsReporter, period time.Duration) {
	if period <= 0 {
		period = DefaultRunningPodsPeriod
	}
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	for {
		reportRunningPods(ctx, provider, vm)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// reportRunningPods reports the provider's running pods once; when the
// provider cannot list them, nothing is reported (the pods stay held).
func reportRunningPods(ctx context.Context, provider node.PodLifecycleHandler, vm RunningPodsReporter) {
	// Dated before the list: a pod started (and force-deleted) while
	// GetPods runs is not released by a list without it.
	report := vm.BeginRunningPods()
	pods, err := provider.GetPods(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot list the provider's pods; the volume manager keeps the volumes of pods it has no word of")
		return
	}
	uids := make([]types.UID, 0, len(pods))
	for _, pod := range pods {
		if pod != nil && !terminal(pod) {
			uids = append(uids, pod.UID)
		}
	}
	report(uids)
}
