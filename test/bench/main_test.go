package bench_test

import (
	"testing"

	"k8s.io/client-go/tools/metrics"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) {
	// Count every API request and its client-side throttling wait, to show
	// where the agent's time goes (apistats_test.go). Assigned directly:
	// controller-runtime (under test/k8s) already spent metrics.Register's
	// once in its init.
	metrics.RateLimiterLatency = apiRequests
	k8stest.Main(m, k8stest.Options{})
}
