package csiclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
)

// TestMetricsTwoDriversOneEndpoint serves two drivers, talks to them through
// Clients sharing one Metrics (one driver through two Clients, as after a
// re-registration), and scrapes a /metrics endpoint that also serves a
// process registry.
func TestMetricsTwoDriversOneEndpoint(t *testing.T) {
	m := csiclient.NewMetrics()

	a := csiclienttest.NewDriver("a.csi.test", "node-1")
	aEndpoint := csiclienttest.StartServer(t, a.Servers())
	a1 := newClient(t, csiclient.Config{DriverName: "a.csi.test", Endpoint: aEndpoint, Metrics: m})
	a2 := newClient(t, csiclient.Config{DriverName: "a.csi.test", Endpoint: aEndpoint, Metrics: m})
	b := csiclienttest.NewDriver("b.csi.test", "node-1")
	bEndpoint := csiclienttest.StartServer(t, b.Servers())
	b1 := newClient(t, csiclient.Config{DriverName: "b.csi.test", Endpoint: bEndpoint, Metrics: m})
	ctx := t.Context()

	if err := a1.NodeStageVolume(ctx, stageRequest()); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if err := a2.NodeStageVolume(ctx, stageRequest()); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	a.SetError(csi.Node_NodeStageVolume_FullMethodName, status.Error(codes.Internal, "boom"))
	if err := a1.NodeStageVolume(ctx, stageRequest()); !csiclient.IsFinal(err) {
		t.Fatalf("NodeStageVolume = %v, want final", err)
	}
	if _, err := b1.NodeGetInfo(ctx); err != nil {
		t.Fatalf("NodeGetInfo: %v", err)
	}
	// Pass-through calls are recorded too.
	if _, err := b1.Controller().ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{}); err != nil {
		t.Fatalf("ControllerGetCapabilities: %v", err)
	}
	// Refused requests never reach the driver and are not recorded.
	if err := b1.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{}); !csiclient.IsFinal(err) {
		t.Fatalf("invalid NodeStageVolume = %v, want final", err)
	}

	process := prometheus.NewRegistry()
	process.MustRegister(collectors.NewGoCollector())
	server := httptest.NewServer(promhttp.HandlerFor(prometheus.Gatherers{process, m}, promhttp.HandlerOpts{}))
	defer server.Close()
	resp, err := http.Get(server.URL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d, %v", resp.StatusCode, err)
	}

	// Durations vary from run to run, so compare the series and their
	// counts: the +Inf bucket and _count lines.
	want := `# HELP csi_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total
# TYPE csi_operations_seconds histogram
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="Internal",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="+Inf"} 1
csi_operations_seconds_count{driver_name="a.csi.test",grpc_status_code="Internal",method_name="/csi.v1.Node/NodeStageVolume",migrated="false"} 1
csi_operations_seconds_bucket{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false",le="+Inf"} 2
csi_operations_seconds_count{driver_name="a.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="false"} 2
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerGetCapabilities",migrated="false",le="+Inf"} 1
csi_operations_seconds_count{driver_name="b.csi.test",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerGetCapabilities",migrated="false"} 1
csi_operations_seconds_bucket{driver_name="b.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeGetInfo",migrated="false",le="+Inf"} 1
csi_operations_seconds_count{driver_name="b.csi.test",grpc_status_code="OK",method_name="/csi.v1.Node/NodeGetInfo",migrated="false"} 1
`
	var got strings.Builder
	for line := range strings.Lines(string(body)) {
		name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE "), "{")
		name, _, _ = strings.Cut(name, " ")
		switch {
		case !strings.HasPrefix(name, "csi_operations_seconds"),
			strings.HasSuffix(name, "_sum"),
			strings.HasSuffix(name, "_bucket") && !strings.Contains(line, `le="+Inf"`):
			continue
		}
		got.WriteString(line)
	}
	if got.String() != want {
		t.Errorf("csi_operations_seconds in /metrics:\n%s\nwant:\n%s\nfull exposition:\n%s", got.String(), want, body)
	}
	if !strings.Contains(string(body), "go_goroutines") {
		t.Errorf("/metrics lacks the process registry's go_goroutines")
	}
}
