package metrics

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestAwaitingRuntimeReadAtScrape(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	var n atomic.Int64
	if err := RegisterAwaitingRuntime(reg, func() int { return int(n.Load()) }); err != nil {
		t.Fatal(err)
	}
	for _, count := range []int64{0, 2} {
		n.Store(count)
		want := `
# HELP csi_volmgr_pods_awaiting_runtime Pods no longer in the desired state whose volumes stay mounted until their runtime says their containers stopped (containers-stopped, or a running-pods report without them)
# TYPE csi_volmgr_pods_awaiting_runtime gauge
csi_volmgr_pods_awaiting_runtime ` + map[int64]string{0: "0", 2: "2"}[count] + "\n"
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), AwaitingRuntimeName); err != nil {
			t.Error(err)
		}
	}
}
