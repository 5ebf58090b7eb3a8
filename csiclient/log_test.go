package csiclient_test

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"sync"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of klog.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// captureGlobalKlog sends the global klog output, at -v=10, to a buffer
// until the end of the test. The test must not run in parallel.
func captureGlobalKlog(t *testing.T) *syncBuffer {
	var flags flag.FlagSet
	klog.InitFlags(&flags)
	set := func(name, value string) {
		if err := flags.Set(name, value); err != nil {
			t.Fatalf("setting klog flag -%s=%s: %v", name, value, err)
		}
	}
	set("v", "10")
	set("logtostderr", "false")
	set("alsologtostderr", "false")
	set("stderrthreshold", "FATAL")
	buf := &syncBuffer{}
	klog.SetOutput(buf)
	t.Cleanup(func() {
		klog.Flush()
		set("v", "0")
		set("logtostderr", "true")
		set("stderrthreshold", "ERROR")
		klog.SetOutput(os.Stderr)
	})
	return buf
}

// TestSecretsNeverLogged makes stage and publish calls carrying secrets,
// successful and failing, with both a contextual logger and the global klog
// logger at -v=10, and checks that the calls are logged but the secret
// values are not, while the driver does receive them.
func TestSecretsNeverLogged(t *testing.T) {
	const secret = "s3cr3t-value-4711"
	global := captureGlobalKlog(t)

	config := ktesting.NewConfig(ktesting.Verbosity(10), ktesting.BufferLogs(true))
	logger := ktesting.NewLogger(t, config)
	contextual := logger.GetSink().(ktesting.Underlier)
	loggedCtx := klog.NewContext(t.Context(), logger)

	d := csiclienttest.NewDriver(driverName, "node-1")
	endpoint := csiclienttest.StartServer(t, d.Servers())
	c, err := csiclient.New(loggedCtx, csiclient.Config{DriverName: driverName, Endpoint: endpoint, Metrics: csiclient.NewMetrics()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer c.Close()

	secrets := map[string]string{"password": secret, "token": secret}
	stage := stageRequest()
	stage.Secrets = secrets
	publish := publishRequest()
	publish.Secrets = secrets

	// Each buffer gets one successful and one failing call of each kind:
	// loggedCtx logs through the contextual logger, t.Context() carries no
	// logger, so the interceptor falls back to the global klog logger.
	if err := c.NodeStageVolume(loggedCtx, stage); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if err := c.NodePublishVolume(t.Context(), publish); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	d.SetError(csi.Node_NodeStageVolume_FullMethodName, status.Error(codes.Internal, "mount failed"))
	d.SetError(csi.Node_NodePublishVolume_FullMethodName, status.Error(codes.Internal, "mount failed"))
	if err := c.NodeStageVolume(t.Context(), stage); !csiclient.IsFinal(err) {
		t.Fatalf("failing NodeStageVolume = %v, want final", err)
	}
	if err := c.NodePublishVolume(loggedCtx, publish); !csiclient.IsFinal(err) {
		t.Fatalf("failing NodePublishVolume = %v, want final", err)
	}
	klog.Flush()

	for name, out := range map[string]string{
		"contextual logger": contextual.GetBuffer().String(),
		"global klog":       global.String(),
	} {
		if strings.Contains(out, secret) {
			t.Errorf("%s output contains the secret value:\n%s", name, out)
		}
		for _, want := range []string{"/csi.v1.Node/NodeStageVolume", "/csi.v1.Node/NodePublishVolume", "***stripped***", "mount failed"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s output lacks %q, so the calls were not logged at V(5):\n%s", name, want, out)
			}
		}
	}

	for _, method := range []string{csi.Node_NodeStageVolume_FullMethodName, csi.Node_NodePublishVolume_FullMethodName} {
		for _, req := range d.Requests(method) {
			if got := req.(interface{ GetSecrets() map[string]string }).GetSecrets()["password"]; got != secret {
				t.Errorf("driver got %s secret %q, want %q", method, got, secret)
			}
		}
	}
}
