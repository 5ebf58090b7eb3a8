package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// AwaitingRuntimeName is the gauge of the pods whose volumes wait for their
// runtime's word.
const AwaitingRuntimeName = "csi_volmgr_pods_awaiting_runtime"

// RegisterAwaitingRuntime registers the csi_volmgr_pods_awaiting_runtime
// gauge into reg: at each scrape, count returns the pods that left the
// desired state and whose volumes stay because their runtime has not said
// their containers stopped (runtimepods.Pods.Awaiting). It stays above
// zero while a runtime never reports. count must be safe to call from any
// goroutine.
func RegisterAwaitingRuntime(reg prometheus.Registerer, count func() int) error {
	if reg == nil || count == nil {
		return errors.New("metrics: a Registerer and a count are required")
	}
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: AwaitingRuntimeName,
		Help: "Pods no longer in the desired state whose volumes stay mounted until their runtime says their " +
			"containers stopped (containers-stopped, or a running-pods report without them)",
	}, func() float64 { return float64(count()) })
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("registering %s: %w", AwaitingRuntimeName, err)
	}
	return nil
}
