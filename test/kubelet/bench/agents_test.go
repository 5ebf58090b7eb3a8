package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/test/gobuild"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// agentVerbosity is both agents' -v: the kubelet's default log level is 0
// and production kubelets often run at 2; 1 logs no per-volume line in
// either agent. EnvVerbosity overrides it, to see where the time went.
var agentVerbosity = 1

// EnvVerbosity names an environment variable with both agents' -v (default 1).
const EnvVerbosity = "KUBELET_BENCH_V"

func init() {
	if v, err := strconv.Atoi(os.Getenv(EnvVerbosity)); err == nil {
		agentVerbosity = v
	}
}

// agentKind is one of the agents the benchmarks compare: how to build and
// start it. Both run as processes of their own with flags only, each on a
// root directory of its own below the same file system, the same API
// server and Node, as the same identity (EnvIdentity: admin, or the
// Node's), and the same plugin.
type agentKind struct {
	// name is how the table names it; short is the prefix of its
	// ReportMetric units.
	name, short string
	binary      *gobuild.Binary
	args        func(kubeconfig, node, root, regDir, httpAddr string) []string
	// socket, if set, is where its JSON API and /debug/pprof/ are served
	// instead of httpAddr (csi-volmgr serves them on its root-only socket;
	// its TCP endpoint asks the API server for credentials).
	socket func(root string) string
	// heapMetric is the Go collector's heap gauge on its /metrics.
	heapMetric string
	// readyMetric is the histogram of its own "pod's volumes ready" signal,
	// if it has one on /metrics.
	readyMetric string
}

// The binaries: make bench-kubelet builds them (csi-volmgr and the test
// plugin in the root module, as `make build` does) and names them in these
// variables; without them, they are built here once per test binary.
var (
	kubeletBinary = &gobuild.Binary{
		Package:     "github.com/csi-volmgr/csi-volmgr/test/kubelet/cmd/kubelet-volumes",
		Name:        "kubelet-volumes",
		EnvOverride: "KUBELET_VOLUMES_BINARY",
	}
	volmgrBinary = &gobuild.Binary{
		Package:     "github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr",
		Name:        "csi-volmgr-kubeletbench",
		EnvOverride: "CSI_VOLMGR_BINARY",
	}
)

var (
	// kubelet is the real kubelet's volume manager (package kubeletvm)
	// with the kubelet's defaults.
	kubelet = &agentKind{
		name: "kubelet", short: "kubelet", binary: kubeletBinary,
		args: func(kubeconfig, node, root, regDir, httpAddr string) []string {
			return []string{
				"--kubeconfig=" + kubeconfig, "--node-name=" + node, "--root-dir=" + root,
				"--registration-dir=" + regDir, "--http-endpoint=" + httpAddr, fmt.Sprintf("--v=%d", agentVerbosity),
			}
		},
		heapMetric: "go_memstats_heap_inuse_bytes",
	}
	// volmgr is csi-volmgr's agent binary with the `run` command's
	// defaults (by-name watches of every referenced object, its API QPS
	// and burst) and --profiling; a column adds its budget and flags.
	volmgr = &agentKind{
		name: "csi-volmgr", short: "volmgr", binary: volmgrBinary,
		args: func(kubeconfig, node, root, regDir, httpAddr string) []string {
			return []string{
				"run", "--kubeconfig=" + kubeconfig, "--node-name=" + node, "--root-dir=" + root,
				"--registration-dir=" + regDir, "--http-endpoint=" + httpAddr, fmt.Sprintf("--v=%d", agentVerbosity),
				// /debug/pprof/, as kubelet-volumes serves it: the harness
				// forces a GC before it reads the heap.
				"--profiling",
				// Plain HTTP on the loopback, as kubelet-volumes serves it:
				// the harness reads /metrics and the health checks.
				"--http-endpoint-plaintext",
			}
		},
		socket:      volumemanager.SocketPath,
		heapMetric:  "go_memstats_heap_inuse_bytes",
		readyMetric: "csi_volmgr_pod_volumes_ready_seconds",
	}
)

// agent is a running agent on the world's Node.
type agent struct {
	kind *agentKind
	col  *column
	// tag prefixes the names of the objects it is given (pods, a
	// namespace): the column's tag and the run, unique in the world.
	tag  string
	proc *process
	// root is its root directory; regDir its registration directory.
	root, regDir string
}

// startAgent starts the column's agent on a fresh root directory, waits
// until it is ready, moves the world's plugin registration socket into its
// registration directory and waits until it registered the driver. When b
// ends, the agent is stopped (if it still runs) and its directory removed.
// run numbers the column's runs in the world (its objects' names).
func startAgent(ctx context.Context, tb testing.TB, w *world, col *column, run int) *agent {
	tb.Helper()
	kind := col.kind
	bin, err := kind.binary.Path()
	if err != nil {
		tb.Fatalf("building %s: %v", kind.name, err)
	}
	// A short path: registration and CSI sockets below it must stay within
	// the 107 bytes of a unix socket path.
	dir, err := os.MkdirTemp("", "kb")
	if err != nil {
		tb.Fatal(err)
	}
	a := &agent{kind: kind, col: col, tag: fmt.Sprintf("%s%d", col.tag, run), root: filepath.Join(dir, "root")}
	a.regDir = filepath.Join(a.root, "plugins_registry")
	if err := os.MkdirAll(a.regDir, 0o750); err != nil {
		tb.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc, identityArgs := w.agentAccess(tb, kind, a.root)
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		tb.Fatal(err)
	}
	addr, err := freeAddress()
	if err != nil {
		tb.Fatal(err)
	}
	args := append(kind.args(kubeconfig, w.fx.NodeName, a.root, a.regDir, addr), identityArgs...)
	a.proc = &process{binary: bin, logFile: filepath.Join(dir, kind.short+".log"), httpAddr: addr,
		args: append(args, col.args...)}
	if kind.socket != nil {
		a.proc.socket = kind.socket(a.root)
	}
	tb.Cleanup(func() {
		if err := a.stop(tb, w); err != nil {
			tb.Errorf("stopping %s: %v", kind.name, err)
		}
		keepLog(tb, a)
		if tb.Failed() {
			tb.Logf("%s log: %s", kind.name, a.proc.logFile)
			return
		}
		removeUnmounted(tb, dir)
	})
	w.forgetVolumesInUse(ctx, tb)
	if err := a.proc.start(ctx); err != nil {
		tb.Fatalf("starting %s: %v", kind.name, err)
	}
	w.moveSocket(tb, w.holdDir, a.regDir)
	waitFor(ctx, tb, 20*time.Millisecond, time.Minute, kind.name+" registered the driver", func() (bool, error) {
		return a.hasDriver(ctx, w.driver)
	})
	return a
}

// stop stops the agent (SIGTERM; both leave the volumes mounted) if it
// runs, and moves the registration socket back out of its directory (also
// after the agent was killed), for the next agent.
func (a *agent) stop(tb testing.TB, w *world) error {
	tb.Helper()
	var err error
	if a.proc.running() {
		err = a.proc.stop()
	}
	if _, serr := os.Stat(filepath.Join(a.regDir, w.socketName())); serr == nil {
		w.moveSocket(tb, a.regDir, w.holdDir)
	}
	return err
}

// restart ends the agent process, with SIGKILL as a crash would if crash,
// else with SIGTERM, and starts it again with the same flags on the same
// root directory; the registration socket stays in place, so the new
// process registers the driver again from its first scan. It returns when
// the agent is ready and lists the driver.
func (a *agent) restart(ctx context.Context, tb testing.TB, w *world, crash bool) {
	tb.Helper()
	end := a.proc.stop
	if crash {
		end = a.proc.kill
	}
	if err := end(); err != nil {
		tb.Fatalf("ending %s: %v", a.kind.name, err)
	}
	if err := a.proc.start(ctx); err != nil {
		tb.Fatalf("restarting %s: %v", a.kind.name, err)
	}
	waitFor(ctx, tb, 20*time.Millisecond, time.Minute, a.kind.name+" registered the driver again", func() (bool, error) {
		return a.hasDriver(ctx, w.driver)
	})
}

// hasDriver reports whether the agent lists the driver as registered
// (both agents answer /api/v1/drivers with a list of {"name": ...}).
func (a *agent) hasDriver(ctx context.Context, driver string) (bool, error) {
	code, body, err := a.proc.get(ctx, "/api/v1/drivers")
	if err != nil || code != http.StatusOK {
		return false, nil //nolint:nilerr // not serving yet: ask again
	}
	var drivers []namedItem
	if err := json.Unmarshal(body, &drivers); err != nil {
		return false, fmt.Errorf("decoding /api/v1/drivers: %w", err)
	}
	return slices.Contains(drivers, namedItem{Name: driver}), nil
}

// namedItem is what both agents' JSON lists have in common.
type namedItem struct {
	Name string `json:"name"`
}

// keepLog copies the agent's log into the results directory (logs/), for
// a reader who wants to know where a figure's time went.
func keepLog(tb testing.TB, a *agent) {
	log, err := os.ReadFile(a.proc.logFile)
	if err != nil {
		return
	}
	dir := filepath.Join(resultsDir(), "logs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	name := strings.NewReplacer("/", "_", "=", "").Replace(tb.Name())
	_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s.log", name, a.tag)), log, 0o644)
}
