package bench_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
	"github.com/csi-volmgr/csi-volmgr/test/kubelet/kubeletvm"
)

// column is one column of the tables: an agent at an API budget, with its
// flags. Every row runs every column of its scenario, EnvRuns times, the
// order of the columns alternating from run to run.
type column struct {
	// id names it in the tables and results.json; tag is the short prefix
	// of its pods' names and ReportMetric units.
	id, tag string
	kind    *agentKind
	// budget is the API budget as "QPS/burst", with "(defaults)" when it
	// is the agent's own default.
	budget string
	// args are its flags beyond the ones every agent gets.
	args []string
	// reference marks the ratios' numerator (the kubelet).
	reference bool
}

// The budgets. The equal footing is the kubelet's default budget (its
// --kube-api-qps 50, --kube-api-burst 100; its heartbeat client is not
// limited and its event client has a budget of its own, as in the
// kubelet), given to both agents; csi-volmgr's is one token bucket for
// all its clients. Each agent's own default is the second column set: the
// kubelet's is the same as the equal budget, so its column is shared.
var (
	kubeletQPS, kubeletBurst = func() (int, int) {
		kc := kubeletvm.Defaults()
		return int(*kc.KubeAPIQPS), int(kc.KubeAPIBurst)
	}()
	volmgrQPS, volmgrBurst = func() (float32, int) {
		c := config.Defaults()
		return c.KubeAPIQPS, c.KubeAPIBurst
	}()
	equalArgs = []string{fmt.Sprintf("--kube-api-qps=%d", kubeletQPS), fmt.Sprintf("--kube-api-burst=%d", kubeletBurst)}
	equal     = fmt.Sprintf("%d/%d", kubeletQPS, kubeletBurst)
)

var (
	colKubelet = &column{id: "kubelet", tag: "k", kind: kubelet, reference: true,
		budget: equal + " (defaults)", args: equalArgs}
	colVolmgr = &column{id: "csi-volmgr@" + equal, tag: "ve", kind: volmgr,
		budget: equal, args: equalArgs}
	colVolmgrDefaults = &column{id: "csi-volmgr@defaults", tag: "vd", kind: volmgr,
		budget: fmt.Sprintf("%g/%d (defaults)", volmgrQPS, volmgrBurst)}
	// colVolmgrWatch is csi-volmgr at the equal budget watching every
	// referenced object for as long as it is referenced
	// (--settled-object-resync=0, the default before issue 24) instead of
	// reading settled ones again: the steady state's other way, not a
	// column of the main rows.
	colVolmgrWatch = &column{id: "csi-volmgr@" + equal + " watch-all", tag: "vw", kind: volmgr,
		budget: equal, args: append(slices.Clone(equalArgs), "--settled-object-resync=0")}
)

const (
	// EnvRuns names an environment variable with how many runs each row
	// gets (default 3); the columns' order alternates between runs.
	EnvRuns = "KUBELET_BENCH_RUNS"
	// EnvBudgets names an environment variable with the column sets:
	// "equal" (both agents at the kubelet's default budget), "defaults"
	// (each at its own); default both.
	EnvBudgets = "KUBELET_BENCH_BUDGETS"
)

// benchRuns is EnvRuns.
func benchRuns(tb testing.TB) int {
	tb.Helper()
	s := os.Getenv(EnvRuns)
	if s == "" {
		return 3
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a count ≥ 1", EnvRuns, s)
	}
	return n
}

// mainColumns are the columns of every row: the kubelet, csi-volmgr at
// the kubelet's budget, csi-volmgr at its own defaults (EnvBudgets and
// EnvAgents choose).
func mainColumns(tb testing.TB) []*column {
	tb.Helper()
	budgets := "equal,defaults"
	if s := os.Getenv(EnvBudgets); s != "" {
		budgets = s
	}
	var out []*column
	for b := range strings.SplitSeq(budgets, ",") {
		switch strings.TrimSpace(b) {
		case "equal":
			out = append(out, colKubelet, colVolmgr)
		case "defaults":
			out = append(out, colKubelet, colVolmgrDefaults)
		default:
			tb.Fatalf("%s=%q: want equal, defaults or both", EnvBudgets, budgets)
		}
	}
	var cols []*column
	for _, c := range []*column{colKubelet, colVolmgr, colVolmgrDefaults} {
		if slices.Contains(out, c) && selected(c.kind) {
			cols = append(cols, c)
		}
	}
	return cols
}

// runOrder is the columns in run r's order: as given in even runs,
// reversed in odd ones.
func runOrder(cols []*column, r int) []*column {
	out := slices.Clone(cols)
	if r%2 == 1 {
		slices.Reverse(out)
	}
	return out
}
