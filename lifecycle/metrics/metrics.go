package metrics

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Label values of storage_operation_duration_seconds' status, as the
// kubelet's (pkg/volume/util/metrics.go).
const (
	StatusSuccess     = "success"
	StatusFailUnknown = "fail-unknown"
)

// pluginPrefix makes the kubelet's fully qualified plugin name of a CSI
// driver: "kubernetes.io/csi:<driver>".
const pluginPrefix = "kubernetes.io/csi:"

// PluginName is the volume_plugin (and plugin_name) label value of a CSI
// driver, "kubernetes.io/csi:<driver>", as the kubelet writes it.
func PluginName(driver string) string { return pluginPrefix + driver }

// OperationBuckets are the kubelet's storage operation buckets, in seconds.
var OperationBuckets = []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600}

// PodReadyBuckets are the buckets of csi_volmgr_pod_volumes_ready_seconds:
// from the milliseconds an event-driven agent adds with a fast driver to the
// minutes a slow attach takes.
var PodReadyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// Config configures Metrics.
type Config struct {
	// Registerer receives every collector. Required.
	Registerer prometheus.Registerer
	// Volumes, if set, is called at each scrape to export
	// volume_manager_total_volumes. It must be cheap and safe to call from
	// any goroutine.
	Volumes func() VolumeCounts
}

// Metrics records the lifecycle's metrics. Its methods are safe for
// concurrent use.
type Metrics struct {
	operations *prometheus.HistogramVec
	podReady   prometheus.Histogram
	workqueue  *workqueueMetrics
}

// New creates the collectors and registers them into cfg.Registerer.
func New(cfg Config) (*Metrics, error) {
	if cfg.Registerer == nil {
		return nil, errors.New("metrics: Config.Registerer is required")
	}
	m := &Metrics{
		operations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "storage_operation_duration_seconds",
			Help:    "Storage operation duration",
			Buckets: OperationBuckets,
		}, []string{"volume_plugin", "operation_name", "status"}),
		podReady: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "csi_volmgr_pod_volumes_ready_seconds",
			Help: "Time from the event that made a pod's volumes wanted (the pod's add or change) " +
				"until all its volumes are published",
			Buckets: PodReadyBuckets,
		}),
		workqueue: newWorkqueueMetrics(),
	}
	collectors := []prometheus.Collector{m.operations, m.podReady}
	collectors = append(collectors, m.workqueue.collectors()...)
	if cfg.Volumes != nil {
		collectors = append(collectors, &volumeCollector{counts: cfg.Volumes})
	}
	for _, c := range collectors {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("registering lifecycle metrics: %w", err)
		}
	}
	return m, nil
}

// ObserveOperation records one lifecycle step of a volume of driver that
// took d, in storage_operation_duration_seconds{volume_plugin,
// operation_name, status}: volume_plugin is "kubernetes.io/csi:<driver>",
// operation_name the step (e.g. "mount_device") and status "success" when
// err is nil, else "fail-unknown", as the kubelet records them.
func (m *Metrics) ObserveOperation(driver string, step volume.Step, err error, d time.Duration) {
	status := StatusSuccess
	if err != nil {
		status = StatusFailUnknown
	}
	m.operations.WithLabelValues(PluginName(driver), string(step), status).Observe(d.Seconds())
}

// ObservePodReady records, in csi_volmgr_pod_volumes_ready_seconds, the
// time from the pod event that made a pod's volumes wanted (firstSeen)
// until all were published (ready). The kubelet has no such metric; the
// name carries the agent's prefix so that it collides with none of the
// kubelet's.
func (m *Metrics) ObservePodReady(_ volume.PodInfo, firstSeen, ready time.Time) {
	m.podReady.Observe(ready.Sub(firstSeen).Seconds())
}
