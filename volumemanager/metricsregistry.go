package volumemanager

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metricsRegistry is the agent's Prometheus registry. It also remembers
// every collector registered into it, so that the metrics reference
// (docs/reference/metrics.md, hack/docgen) is made from the collectors the
// agent really registers.
type metricsRegistry struct {
	*prometheus.Registry

	mu         sync.Mutex
	collectors []prometheus.Collector
}

func newMetricsRegistry() *metricsRegistry {
	return &metricsRegistry{Registry: prometheus.NewRegistry()}
}

// Register implements prometheus.Registerer.
func (r *metricsRegistry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r *metricsRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// MetricCollectors returns every collector registered in the agent's
// registry so far (New registers all but the front endpoint's, which Run
// registers when it starts it). /metrics serves them with the CSI call
// latencies of Metrics' other part, csiclient.Metrics.
func (vm *VolumeManager) MetricCollectors() []prometheus.Collector {
	vm.metrics.mu.Lock()
	defer vm.metrics.mu.Unlock()
	return slices.Clone(vm.metrics.collectors)
}
