package metrics_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/util/workqueue"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func newMetrics(t *testing.T, cfg metrics.Config) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	cfg.Registerer = reg
	m, err := metrics.New(cfg)
	if err != nil {
		t.Fatalf("New() error: %v", err)
	}
	return m, reg
}

// TestOperationDuration records steps of two drivers, one failed, and
// compares the exposition with the kubelet's names, labels and buckets.
func TestOperationDuration(t *testing.T) {
	m, reg := newMetrics(t, metrics.Config{})
	m.ObserveOperation("a.csi.test", volume.StepStage, volume.Filesystem, false, nil, 200*time.Millisecond)
	m.ObserveOperation("a.csi.test", volume.StepStage, volume.Filesystem, false, nil, 20*time.Second)
	m.ObserveOperation("b.csi.test", volume.StepPublish, volume.Filesystem, false, errors.New("boom"), 700*time.Second)

	want := `
# HELP storage_operation_duration_seconds [BETA] Storage operation duration
# TYPE storage_operation_duration_seconds histogram
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="0.1"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="0.25"} 1
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="0.5"} 1
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="1"} 1
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="2.5"} 1
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="5"} 1
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="10"} 1
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="15"} 1
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="25"} 2
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="50"} 2
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="120"} 2
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="300"} 2
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="600"} 2
storage_operation_duration_seconds_bucket{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test",le="+Inf"} 2
storage_operation_duration_seconds_sum{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test"} 20.2
storage_operation_duration_seconds_count{migrated="false",operation_name="mount_device",status="success",volume_plugin="kubernetes.io/csi:a.csi.test"} 2
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="0.1"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="0.25"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="0.5"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="1"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="2.5"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="5"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="10"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="15"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="25"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="50"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="120"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="300"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="600"} 0
storage_operation_duration_seconds_bucket{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test",le="+Inf"} 1
storage_operation_duration_seconds_sum{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test"} 700
storage_operation_duration_seconds_count{migrated="false",operation_name="volume_mount",status="fail-unknown",volume_plugin="kubernetes.io/csi:b.csi.test"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "storage_operation_duration_seconds"); err != nil {
		t.Fatal(err)
	}
}

// TestBlockOperationNames: a block volume's steps are recorded under the
// kubelet's names for them, map_volume, unmap_volume and unmap_device; a
// file system's under mount_device, volume_mount, volume_unmount and
// unmount_device.
func TestBlockOperationNames(t *testing.T) {
	m, reg := newMetrics(t, metrics.Config{})
	steps := []volume.Step{volume.StepWaitForAttach, volume.StepStage, volume.StepPublish, volume.StepUnpublish,
		volume.StepUnstage, volume.StepExpand}
	for _, access := range []volume.AccessType{volume.Filesystem, volume.Block} {
		for _, s := range steps {
			m.ObserveOperation("a.csi.test", s, access, false, nil, time.Second)
		}
	}
	var got []string
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "storage_operation_duration_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			var name string
			for _, l := range mt.GetLabel() {
				if l.GetName() == "operation_name" {
					name = l.GetValue()
				}
			}
			got = append(got, fmt.Sprintf("%s=%d", name, mt.GetHistogram().GetSampleCount()))
		}
	}
	slices.Sort(got)
	want := []string{"expand_volume=2", "map_volume=2", "mount_device=1", "unmap_device=1", "unmap_volume=1",
		"unmount_device=1", "verify_controller_attached_volume=2", "volume_mount=1", "volume_unmount=1"}
	if !slices.Equal(got, want) {
		t.Errorf("operation_name counts %v, want %v", got, want)
	}
}

// TestMigratedLabel: a step of an in-tree volume translated to CSI is
// recorded with migrated="true" under its CSI driver's plugin name, as the
// kubelet records volume.Spec.Migrated; other steps with "false".
func TestMigratedLabel(t *testing.T) {
	m, reg := newMetrics(t, metrics.Config{})
	m.ObserveOperation("ebs.csi.aws.com", volume.StepStage, volume.Filesystem, true, nil, time.Second)
	m.ObserveOperation("ebs.csi.aws.com", volume.StepStage, volume.Filesystem, false, nil, time.Second)
	m.ObserveOperation("ebs.csi.aws.com", volume.StepUnstage, volume.Filesystem, true, nil, time.Second)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		if mf.GetName() != "storage_operation_duration_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got = append(got, fmt.Sprintf("%s %s migrated=%s", labels["volume_plugin"], labels["operation_name"], labels["migrated"]))
		}
	}
	slices.Sort(got)
	want := []string{
		"kubernetes.io/csi:ebs.csi.aws.com mount_device migrated=false",
		"kubernetes.io/csi:ebs.csi.aws.com mount_device migrated=true",
		"kubernetes.io/csi:ebs.csi.aws.com unmount_device migrated=true",
	}
	if !slices.Equal(got, want) {
		t.Errorf("series %q, want %q", got, want)
	}
}

// TestPodReady checks the pod-ready latency histogram with its buckets.
func TestPodReady(t *testing.T) {
	m, reg := newMetrics(t, metrics.Config{})
	pod := volume.PodInfo{UID: "uid-p", Namespace: "ns", Name: "p"}
	seen := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	m.ObservePodReady(pod, seen, seen.Add(3*time.Millisecond))
	m.ObservePodReady(pod, seen, seen.Add(40*time.Second))

	want := `
# HELP csi_volmgr_pod_volumes_ready_seconds Time from the event that made a pod's volumes wanted (the pod's add or change) until all its volumes are published
# TYPE csi_volmgr_pod_volumes_ready_seconds histogram
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.001"} 0
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.0025"} 0
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.005"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.01"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.025"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.05"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.1"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.25"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="0.5"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="1"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="2.5"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="5"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="10"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="30"} 1
csi_volmgr_pod_volumes_ready_seconds_bucket{le="60"} 2
csi_volmgr_pod_volumes_ready_seconds_bucket{le="120"} 2
csi_volmgr_pod_volumes_ready_seconds_bucket{le="300"} 2
csi_volmgr_pod_volumes_ready_seconds_bucket{le="600"} 2
csi_volmgr_pod_volumes_ready_seconds_bucket{le="+Inf"} 2
csi_volmgr_pod_volumes_ready_seconds_sum 40.003
csi_volmgr_pod_volumes_ready_seconds_count 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "csi_volmgr_pod_volumes_ready_seconds"); err != nil {
		t.Fatal(err)
	}
}

// TestTotalVolumesReadAtScrape checks that volume_manager_total_volumes is
// what the callback says at each scrape (no counter to drift), that a
// driver present in one state only shows 0 in the other, and that a driver
// gone from both disappears.
func TestTotalVolumesReadAtScrape(t *testing.T) {
	var mu sync.Mutex
	counts := metrics.VolumeCounts{
		Desired: map[string]int{"a.csi.test": 3, "b.csi.test": 1},
		Actual:  map[string]int{"a.csi.test": 2},
	}
	_, reg := newMetrics(t, metrics.Config{Volumes: func() metrics.VolumeCounts {
		mu.Lock()
		defer mu.Unlock()
		return counts
	}})

	header := `
# HELP volume_manager_total_volumes [ALPHA] Number of volumes in Volume Manager
# TYPE volume_manager_total_volumes gauge
`
	want := header + `volume_manager_total_volumes{plugin_name="kubernetes.io/csi:a.csi.test",state="actual_state_of_world"} 2
volume_manager_total_volumes{plugin_name="kubernetes.io/csi:a.csi.test",state="desired_state_of_world"} 3
volume_manager_total_volumes{plugin_name="kubernetes.io/csi:b.csi.test",state="actual_state_of_world"} 0
volume_manager_total_volumes{plugin_name="kubernetes.io/csi:b.csi.test",state="desired_state_of_world"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "volume_manager_total_volumes"); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	counts = metrics.VolumeCounts{
		Desired: map[string]int{"a.csi.test": 1},
		Actual:  map[string]int{"a.csi.test": 1},
	}
	mu.Unlock()
	want = header + `volume_manager_total_volumes{plugin_name="kubernetes.io/csi:a.csi.test",state="actual_state_of_world"} 1
volume_manager_total_volumes{plugin_name="kubernetes.io/csi:a.csi.test",state="desired_state_of_world"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "volume_manager_total_volumes"); err != nil {
		t.Fatal(err)
	}
}

// TestWorkqueueProvider runs a real named client-go workqueue with the
// provider and checks depth, adds and retries as a scrape shows them.
func TestWorkqueueProvider(t *testing.T) {
	m, reg := newMetrics(t, metrics.Config{})
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Hour, time.Hour),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "test_queue", MetricsProvider: m.WorkqueueProvider()})
	defer q.ShutDown()

	q.Add("a")
	q.Add("b")
	q.Add("a") // deduplicated: not counted as an add
	item, _ := q.Get()
	q.Done(item)
	q.AddRateLimited("c") // waits an hour: a retry, not (yet) in the queue

	want := `
# HELP workqueue_adds_total Total number of adds handled by workqueue
# TYPE workqueue_adds_total counter
workqueue_adds_total{name="test_queue"} 2
# HELP workqueue_depth Current depth of workqueue
# TYPE workqueue_depth gauge
workqueue_depth{name="test_queue"} 1
# HELP workqueue_retries_total Total number of retries handled by workqueue
# TYPE workqueue_retries_total counter
workqueue_retries_total{name="test_queue"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"workqueue_adds_total", "workqueue_depth", "workqueue_retries_total"); err != nil {
		t.Fatal(err)
	}
	// One item was processed: one latency and one work-duration observation.
	for _, name := range []string{"workqueue_queue_duration_seconds", "workqueue_work_duration_seconds"} {
		if got := testutil.CollectAndCount(reg, name); got != 1 {
			t.Errorf("%s has %d series, want 1", name, got)
		}
	}
}

// TestNewErrors checks the configuration errors: no registerer, and a
// second registration into the same registry.
func TestNewErrors(t *testing.T) {
	if _, err := metrics.New(metrics.Config{}); err == nil {
		t.Error("New() without Registerer succeeded, want an error")
	}
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(metrics.Config{Registerer: reg}); err != nil {
		t.Fatalf("first New() error: %v", err)
	}
	_, err := metrics.New(metrics.Config{Registerer: reg})
	if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); !ok {
		t.Errorf("second New() into the same registry: error %v, want a prometheus.AlreadyRegisteredError", err)
	}
}
