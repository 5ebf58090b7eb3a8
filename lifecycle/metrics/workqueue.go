package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// workqueueMetrics are client-go's workqueue metrics, labelled by queue
// name, with the names, help and buckets of
// k8s.io/component-base/metrics/prometheus/workqueue, so dashboards made
// for Kubernetes components work unchanged. Unlike that package they live
// in the caller's registry.
type workqueueMetrics struct {
	depth, unfinished, longestRunning *prometheus.GaugeVec
	adds, retries                     *prometheus.CounterVec
	latency, workDuration             *prometheus.HistogramVec
}

var _ workqueue.MetricsProvider = &workqueueMetrics{}

func newWorkqueueMetrics() *workqueueMetrics {
	const subsystem = "workqueue"
	labels := []string{"name"}
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 10)
	return &workqueueMetrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "depth",
			Help: "Current depth of workqueue",
		}, labels),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "adds_total",
			Help: "Total number of adds handled by workqueue",
		}, labels),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem, Name: "queue_duration_seconds",
			Help:    "How long in seconds an item stays in workqueue before being requested.",
			Buckets: buckets,
		}, labels),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: subsystem, Name: "work_duration_seconds",
			Help:    "How long in seconds processing an item from workqueue takes.",
			Buckets: buckets,
		}, labels),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "unfinished_work_seconds",
			Help: "How many seconds of work has done that is in progress and hasn't been observed by " +
				"work_duration. Large values indicate stuck threads. One can deduce the number of stuck " +
				"threads by observing the rate at which this increases.",
		}, labels),
		longestRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: subsystem, Name: "longest_running_processor_seconds",
			Help: "How many seconds has the longest running processor for workqueue been running.",
		}, labels),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: subsystem, Name: "retries_total",
			Help: "Total number of retries handled by workqueue",
		}, labels),
	}
}

func (w *workqueueMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{w.depth, w.adds, w.latency, w.workDuration, w.unfinished, w.longestRunning, w.retries}
}

// WorkqueueProvider returns the workqueue.MetricsProvider that records into
// m's registry the metrics of every named workqueue: workqueue_depth,
// workqueue_adds_total, workqueue_queue_duration_seconds,
// workqueue_work_duration_seconds, workqueue_unfinished_work_seconds,
// workqueue_longest_running_processor_seconds and workqueue_retries_total,
// each labelled name="<queue name>". Install it once per process with
// workqueue.SetProvider before any queue is created, or give it to each
// queue in its config (TypedRateLimitingQueueConfig.MetricsProvider).
func (m *Metrics) WorkqueueProvider() workqueue.MetricsProvider { return m.workqueue }

// NewDepthMetric implements workqueue.MetricsProvider.
func (w *workqueueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return w.depth.WithLabelValues(name)
}

// NewAddsMetric implements workqueue.MetricsProvider.
func (w *workqueueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return w.adds.WithLabelValues(name)
}

// NewLatencyMetric implements workqueue.MetricsProvider.
func (w *workqueueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return w.latency.WithLabelValues(name)
}

// NewWorkDurationMetric implements workqueue.MetricsProvider.
func (w *workqueueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return w.workDuration.WithLabelValues(name)
}

// NewUnfinishedWorkSecondsMetric implements workqueue.MetricsProvider.
func (w *workqueueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return w.unfinished.WithLabelValues(name)
}

// NewLongestRunningProcessorSecondsMetric implements workqueue.MetricsProvider.
func (w *workqueueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return w.longestRunning.WithLabelValues(name)
}

// NewRetriesMetric implements workqueue.MetricsProvider.
func (w *workqueueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return w.retries.WithLabelValues(name)
}
