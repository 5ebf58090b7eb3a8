package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/front"
	"github.com/csi-volmgr/csi-volmgr/lifecycle"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// metricInfo is one metric of the reference.
type metricInfo struct {
	name, typ, help string
	labels          []string
}

// idleTypes are the types of the metrics whose collectors export nothing
// while the agent holds no volume, so that their samples cannot tell. A
// metric the reference cannot type fails the generator, and so does an
// entry here that no collector describes.
var idleTypes = map[string]dto.MetricType{
	"storage_operation_duration_seconds":          dto.MetricType_HISTOGRAM,
	"volume_manager_total_volumes":                dto.MetricType_GAUGE,
	"kubelet_volume_stats_capacity_bytes":         dto.MetricType_GAUGE,
	"kubelet_volume_stats_available_bytes":        dto.MetricType_GAUGE,
	"kubelet_volume_stats_used_bytes":             dto.MetricType_GAUGE,
	"kubelet_volume_stats_inodes":                 dto.MetricType_GAUGE,
	"kubelet_volume_stats_inodes_free":            dto.MetricType_GAUGE,
	"kubelet_volume_stats_inodes_used":            dto.MetricType_GAUGE,
	"kubelet_volume_stats_health_status_abnormal": dto.MetricType_GAUGE,
}

// metricsReference describes every metric the agent serves on /metrics:
// the collectors a VolumeManager registers when it is built (in cluster
// mode with every option that adds metrics; its API server is never
// asked), the front endpoint's, which Run registers, and the CSI call
// latencies of csiclient. The Go runtime's and the process's own
// collectors are left out.
func metricsReference(ctx context.Context) ([]byte, error) {
	collectors, err := agentCollectors(ctx)
	if err != nil {
		return nil, err
	}
	var infos []metricInfo
	unusedIdle := map[string]bool{}
	for name := range idleTypes {
		unusedIdle[name] = true
	}
	for _, c := range collectors {
		found, err := describe(c, unusedIdle)
		if err != nil {
			return nil, err
		}
		infos = append(infos, found...)
	}
	if len(unusedIdle) > 0 {
		return nil, fmt.Errorf("idleTypes names metrics no collector describes: %v", sortedKeys(unusedIdle))
	}
	csi, err := csiCallMetrics()
	if err != nil {
		return nil, err
	}
	infos = append(infos, csi...)
	infos = slices.DeleteFunc(infos, func(m metricInfo) bool {
		return strings.HasPrefix(m.name, "go_") || strings.HasPrefix(m.name, "process_")
	})
	slices.SortFunc(infos, func(a, b metricInfo) int { return strings.Compare(a.name, b.name) })
	d := newDoc("Metrics reference", `
Every metric `+"`/metrics`"+` serves (on the API socket and on `+"`--http-endpoint`"+`: to
anyone on a loopback address, elsewhere to callers authorized for get on `+"`nodes/metrics`"+`),
from the collectors the agent registers. Besides these,
client_golang's Go runtime (`+"`go_*`"+`) and process (`+"`process_*`"+`) collectors.
The `+"`workqueue_*`"+` metrics are labelled by queue name, with the names, help and
buckets of Kubernetes components; `+"`storage_operation_duration_seconds`"+`,
`+"`volume_manager_total_volumes`"+`, `+"`csi_operations_seconds`"+` and
`+"`kubelet_volume_stats_*`"+` are the kubelet's. What to watch:
[operations](../operations.md).`)
	rows := make([][]string, 0, len(infos))
	for _, m := range infos {
		rows = append(rows, []string{code(m.name), m.typ, strings.Join(m.labels, ", "), m.help})
	}
	d.table([]string{"metric", "type", "labels", "help"}, rows)
	return d.Bytes(), nil
}

// agentCollectors builds a VolumeManager as `csi-volmgr run
// --register-node --wait-for-containers-stopped --expected-drivers=...`
// would, with an API client that is never used, and returns its
// collectors with the front endpoint's.
func agentCollectors(ctx context.Context) ([]prometheus.Collector, error) {
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.Background()))
	defer cancel()
	dir, err := os.MkdirTemp("", "docgen-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		return nil, err
	}
	vm, err := volumemanager.New(ctx, volumemanager.Config{
		NodeName: "docgen", RootDir: dir, KubeClient: client, ReportClient: client,
		RegisterNode: true, ExpectedDrivers: []string{"docgen.csi"}, WaitForContainersStopped: true,
		Changes: lifecycle.ChangesConfig{MountCheckPeriod: time.Minute},
	})
	if err != nil {
		return nil, fmt.Errorf("building a volume manager: %w", err)
	}
	reg := &recorder{}
	if _, err := front.New(front.Config{
		Endpoint: dir + "/front.sock", Driver: "docgen.csi", Drivers: vm.Drivers(),
		Operations: noOperations{}, Registerer: reg,
	}); err != nil {
		return nil, fmt.Errorf("building a front endpoint: %w", err)
	}
	return append(vm.MetricCollectors(), reg.collectors...), nil
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// noOperations stands for the lifecycle's operations in a front endpoint
// that is built and never started.
type noOperations struct{ front.Operations }

// describe returns the metrics of c. The type of each comes from what c
// collects, else from c's own type (a vector without children), else from
// idleTypes, whose used entries it deletes from unusedIdle.
func describe(c prometheus.Collector, unusedIdle map[string]bool) ([]metricInfo, error) {
	descs := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(descs); close(descs) }()
	samples := make(chan prometheus.Metric, 256)
	go func() { c.Collect(samples); close(samples) }()
	typeOf := map[string]dto.MetricType{}
	for m := range samples {
		info, err := parseDesc(m.Desc())
		if err != nil {
			return nil, err
		}
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			return nil, err
		}
		switch {
		case pb.Counter != nil:
			typeOf[info.name] = dto.MetricType_COUNTER
		case pb.Gauge != nil:
			typeOf[info.name] = dto.MetricType_GAUGE
		case pb.Histogram != nil:
			typeOf[info.name] = dto.MetricType_HISTOGRAM
		case pb.Summary != nil:
			typeOf[info.name] = dto.MetricType_SUMMARY
		}
	}
	var out []metricInfo
	for desc := range descs {
		info, err := parseDesc(desc)
		if err != nil {
			return nil, err
		}
		t, ok := typeOf[info.name]
		if !ok {
			t, ok = vectorType(c)
		}
		if !ok {
			if t, ok = idleTypes[info.name]; ok {
				delete(unusedIdle, info.name)
			}
		}
		if !ok && !strings.HasPrefix(info.name, "go_") && !strings.HasPrefix(info.name, "process_") {
			return nil, fmt.Errorf("cannot tell the type of %s (%T): add it to idleTypes", info.name, c)
		}
		info.typ = strings.ToLower(t.String())
		out = append(out, info)
	}
	return out, nil
}

func vectorType(c prometheus.Collector) (dto.MetricType, bool) {
	switch c.(type) {
	case *prometheus.CounterVec:
		return dto.MetricType_COUNTER, true
	case *prometheus.GaugeVec:
		return dto.MetricType_GAUGE, true
	case *prometheus.HistogramVec:
		return dto.MetricType_HISTOGRAM, true
	case *prometheus.SummaryVec:
		return dto.MetricType_SUMMARY, true
	}
	return 0, false
}

var descPattern = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

// parseDesc reads a Desc's name, help and labels from its String, the
// only form in which client_golang shows them.
func parseDesc(d *prometheus.Desc) (metricInfo, error) {
	m := descPattern.FindStringSubmatch(d.String())
	if m == nil {
		return metricInfo{}, fmt.Errorf("cannot read %s", d)
	}
	name, err := strconv.Unquote(m[1])
	if err != nil {
		return metricInfo{}, err
	}
	help, err := strconv.Unquote(m[2])
	if err != nil {
		return metricInfo{}, err
	}
	info := metricInfo{name: name, help: help}
	for _, l := range strings.Split(m[4], ",") {
		if l != "" {
			info.labels = append(info.labels, l)
		}
	}
	// Constant labels by name only: their values (a build's version, say)
	// differ from one build to the next.
	for _, l := range constLabelPattern.FindAllStringSubmatch(m[3], -1) {
		info.labels = append(info.labels, l[1])
	}
	return info, nil
}

var constLabelPattern = regexp.MustCompile(`(\w+)="(?:[^"\\]|\\.)*"`)

// csiCallMetrics describes the CSI call latency histogram of
// csiclient.Metrics, made with csiclient's options: its csi-lib-utils
// manager exports it once a call was recorded.
func csiCallMetrics() ([]metricInfo, error) {
	mm := metrics.NewCSIMetricsManagerWithOptions("docgen.csi",
		metrics.WithSubsystem(csiclient.MetricsSubsystem), metrics.WithProcessStartTime(false))
	mm.RecordMetrics("/csi.v1.Node/NodeGetInfo", errors.New("docgen"), time.Millisecond)
	families, err := mm.GetRegistry().Gather()
	if err != nil {
		return nil, err
	}
	var out []metricInfo
	for _, f := range families {
		info := metricInfo{name: f.GetName(), help: f.GetHelp(), typ: strings.ToLower(f.GetType().String())}
		if len(f.Metric) > 0 {
			for _, l := range f.Metric[0].Label {
				info.labels = append(info.labels, l.GetName())
			}
		}
		out = append(out, info)
	}
	return out, nil
}
