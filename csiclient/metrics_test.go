package csiclient

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/component-base/metrics/testutil"
)

// TestMetricsExposition records fixed durations for two drivers, and for
// one of them through two managers (two Clients of the same driver), and
// compares the merged exposition, as csi-lib-utils metrics_test.go does.
func TestMetricsExposition(t *testing.T) {
	m := NewMetrics()
	m.manager("a.csi.test").RecordMetrics(
		"/csi.v1.Node/NodeStageVolume", nil, 20*time.Second)
	// A second Client of the same driver shares the series.
	m.manager("a.csi.test").RecordMetrics(
		"/csi.v1.Node/NodeStageVolume", nil, 200*time.Millisecond)
	m.manager("b.csi.test").RecordMetrics(
		"/csi.v1.Node/NodePublishVolume", status.Error(codes.DeadlineExceeded, "timeout"), 120*time.Second)

	want := `
# HELP csi_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total
# TYPE csi_operations_seconds histogram
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="0.1"} 0
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="0.25"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="0.5"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="1"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="2.5"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="5"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="10"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="15"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="25"} 2
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="50"} 2
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="120"} 2
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="300"} 2
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="600"} 2
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="+Inf"} 2
csi_operations_seconds_sum{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false"} 20.2
csi_operations_seconds_count{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false"} 2
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="0.1"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="0.25"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="0.5"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="1"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="2.5"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="5"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="10"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="15"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="25"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="50"} 0
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="120"} 1
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="300"} 1
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="600"} 1
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false",le="+Inf"} 1
csi_operations_seconds_sum{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false"} 120
csi_operations_seconds_count{driver_name="b.csi.test",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodePublishVolume",migrated="false"} 1
`
	if err := testutil.GatherAndCompare(m, strings.NewReader(want), "csi_operations_seconds"); err != nil {
		t.Fatal(err)
	}
}

// TestMetricsOnlyCSIOperations checks that nothing but
// csi_operations_seconds is exposed, so the Metrics can be merged with the
// process's other registries without collisions (no
// process_start_time_seconds from each driver's registry).
func TestMetricsOnlyCSIOperations(t *testing.T) {
	m := NewMetrics()
	m.manager("a.csi.test").RecordMetrics("/csi.v1.Identity/Probe", nil, time.Millisecond)
	m.manager("b.csi.test").RecordMetrics("/csi.v1.Identity/Probe", nil, time.Millisecond)

	families, err := m.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	if len(names) != 1 || names[0] != "csi_operations_seconds" {
		t.Errorf("gathered families %v, want only [csi_operations_seconds]", names)
	}
}
