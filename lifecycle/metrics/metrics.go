package metrics

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	k8smetrics "k8s.io/component-base/metrics"

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
	operations *k8smetrics.HistogramVec
	podReady   prometheus.Histogram
	workqueue  *workqueueMetrics
}

// New creates the collectors and registers them into cfg.Registerer.
func New(cfg Config) (*Metrics, error) {
	if cfg.Registerer == nil {
		return nil, errors.New("metrics: Config.Registerer is required")
	}
	m := &Metrics{
		operations: NewOperationHistogram(),
		podReady: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "csi_volmgr_pod_volumes_ready_seconds",
			Help: "Time from the event that made a pod's volumes wanted (the pod's add or change) " +
				"until all its volumes are published",
			Buckets: PodReadyBuckets,
		}),
		workqueue: newWorkqueueMetrics(),
	}
	if err := Register(cfg.Registerer, m.operations); err != nil {
		return nil, fmt.Errorf("registering lifecycle metrics: %w", err)
	}
	if cfg.Volumes != nil {
		if err := RegisterStable(cfg.Registerer, NewVolumeCollector(cfg.Volumes)); err != nil {
			return nil, fmt.Errorf("registering lifecycle metrics: %w", err)
		}
	}
	collectors := []prometheus.Collector{m.podReady}
	collectors = append(collectors, m.workqueue.collectors()...)
	for _, c := range collectors {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("registering lifecycle metrics: %w", err)
		}
	}
	return m, nil
}

// NewOperationHistogram returns storage_operation_duration_seconds as the
// kubelet defines it (k8s.io/kubernetes pkg/volume/util/metrics.go): a
// BETA histogram with its buckets and the labels volume_plugin,
// operation_name, status and migrated. It is not registered.
func NewOperationHistogram() *k8smetrics.HistogramVec {
	return k8smetrics.NewHistogramVec(&k8smetrics.HistogramOpts{
		Name:           "storage_operation_duration_seconds",
		Help:           "Storage operation duration",
		Buckets:        OperationBuckets,
		StabilityLevel: k8smetrics.BETA,
	}, []string{"volume_plugin", "operation_name", "status", "migrated"})
}

// Register creates the component-base metric c, as a component-base
// registry does, and registers it into reg, so that metrics defined as
// the kubelet defines them live in the caller's registry.
func Register(reg prometheus.Registerer, c k8smetrics.Registerable) error {
	if !c.Create(nil) {
		return nil // hidden
	}
	return reg.Register(c)
}

// RegisterStable does for a component-base StableCollector what Register
// does for a metric.
func RegisterStable(reg prometheus.Registerer, c k8smetrics.StableCollector) error {
	if !c.Create(nil, c) {
		return nil // every metric hidden
	}
	return reg.Register(c)
}

// OperationName is the kubelet's operation_name of step for a volume of
// access type access: a block volume's stage and publish are its
// map_volume, its unpublish unmap_volume and its unstage unmap_device (the
// kubelet's GenerateMapVolumeFunc, GenerateUnmapVolumeFunc and
// GenerateUnmapDeviceFunc); every other step is named as for a file
// system.
func OperationName(step volume.Step, access volume.AccessType) string {
	if access == volume.Block {
		switch step {
		case volume.StepStage, volume.StepPublish:
			return "map_volume"
		case volume.StepUnpublish:
			return "unmap_volume"
		case volume.StepUnstage:
			return "unmap_device"
		}
	}
	return string(step)
}

// ObserveOperation records one lifecycle step of a volume of driver that
// took d, in storage_operation_duration_seconds{volume_plugin,
// operation_name, status, migrated}: volume_plugin is
// "kubernetes.io/csi:<driver>", operation_name the kubelet's name of the
// step for the access type (OperationName: "mount_device" for a file
// system's stage, "map_volume" for a block volume's), status "success"
// when err is nil, else "fail-unknown", and migrated "true" for an
// in-tree volume translated to CSI, as the kubelet records them (its
// volume.Spec.Migrated): the plugin label is the CSI driver's either way.
func (m *Metrics) ObserveOperation(driver string, step volume.Step, access volume.AccessType, migrated bool, err error, d time.Duration) {
	status := StatusSuccess
	if err != nil {
		status = StatusFailUnknown
	}
	m.operations.WithLabelValues(PluginName(driver), OperationName(step, access), status, strconv.FormatBool(migrated)).Observe(d.Seconds())
}

// ObservePodReady records, in csi_volmgr_pod_volumes_ready_seconds, the
// time from the pod event that made a pod's volumes wanted (firstSeen)
// until all were published (ready). The kubelet has no such metric; the
// name carries the agent's prefix so that it collides with none of the
// kubelet's.
func (m *Metrics) ObservePodReady(_ volume.PodInfo, firstSeen, ready time.Time) {
	m.podReady.Observe(ready.Sub(firstSeen).Seconds())
}
