package csiclient

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// MetricsSubsystem is the prefix of the recorded histogram, which is
// therefore named csi_operations_seconds, like the kubelet's.
const MetricsSubsystem = "csi"

// MigratedLabel is the kubelet's label of csi_operations_seconds that says
// whether the volume was migrated from an in-tree plugin.
const MigratedLabel = "migrated"

// Metrics records the latency of every CSI call made by the Clients that
// share it, as the histogram
//
//	csi_operations_seconds{driver_name, method_name, grpc_status_code, migrated}
//
// method_name is the full gRPC method ("/csi.v1.Node/NodeStageVolume") and
// grpc_status_code the code name ("OK", "DeadlineExceeded", ...), as
// recorded by the csi-lib-utils connection interceptor; migrated is
// "false", the kubelet's labels (pkg/volume/util/metrics.go).
//
// One Metrics serves any number of drivers: each driver name gets its own
// csi-lib-utils metrics manager and registry (their driver_name label is
// fixed per manager), and Gather merges them into one exposition, so there
// is no duplicate registration however many Clients come and go. Series are
// kept after a driver's Clients are closed, as Prometheus expects.
type Metrics struct {
	mu sync.Mutex
	// managers maps a driver name to its metrics manager; guarded by mu.
	// Entries are never removed.
	managers map[string]metrics.CSIMetricsManager
}

var _ prometheus.Gatherer = &Metrics{}

// NewMetrics returns an empty recorder.
func NewMetrics() *Metrics {
	return &Metrics{managers: map[string]metrics.CSIMetricsManager{}}
}

// manager returns the metrics manager of driver, creating it on first use.
func (m *Metrics) manager(driver string) metrics.CSIMetricsManager {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mm, ok := m.managers[driver]; ok {
		return mm
	}
	mm := metrics.NewCSIMetricsManagerWithOptions(driver,
		metrics.WithSubsystem(MetricsSubsystem),
		// Several managers live in one process; process_start_time_seconds
		// from each would collide when merged.
		metrics.WithProcessStartTime(false),
		// The kubelet's label set: its calls carry migrated, "true" for
		// in-tree volumes translated to CSI; the agent does not mark them.
		metrics.WithLabels(map[string]string{MigratedLabel: "false"}),
	)
	m.managers[driver] = mm
	return mm
}

// Record records one call of method to driver that ended with err after d,
// as the connection interceptor of every Client records its calls.
func (m *Metrics) Record(driver, method string, err error, d time.Duration) {
	m.manager(driver).RecordMetrics(method, err, d)
}

// Gather implements prometheus.Gatherer: it merges the metrics of all
// drivers. Serve it with promhttp.HandlerFor, or combine it with other
// registries in a prometheus.Gatherers.
func (m *Metrics) Gather() ([]*dto.MetricFamily, error) {
	m.mu.Lock()
	gatherers := make(prometheus.Gatherers, 0, len(m.managers))
	for _, driver := range slices.Sorted(maps.Keys(m.managers)) {
		gatherers = append(gatherers, m.managers[driver].GetRegistry())
	}
	m.mu.Unlock()
	return gatherers.Gather()
}

// Gatherer returns m as a prometheus.Gatherer.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m }
