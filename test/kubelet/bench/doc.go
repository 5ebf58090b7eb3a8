// Package bench runs the real kubelet's volume manager and csi-volmgr one
// after the other on the same objects — one kube-apiserver (test/k8s), one
// Node, the CSI test plugin over real plugin registration and real bind
// mounts, the same PVCs and PVs — and prints each figure for both and
// their ratio (issues 17 and 24).
//
// Both agents run as processes of their own, started with command-line
// flags: kubelet-volumes (package kubeletvm: the kubelet's volumemanager,
// CSI plugin and plugin manager with the kubelet's defaults) and
// csi-volmgr's `run` command with its defaults. Separate processes measure
// each agent's CPU time and memory as /proc reports them for that process
// alone, and keep the kubelet's CSI plugin globals (one set per process)
// apart from everything else. What either agent did is read from the
// plugin's journal, which costs neither agent anything; their HTTP
// endpoints are asked only outside the measured windows.
//
// Equal footing (columns_test.go): every row runs three columns — the
// kubelet at its defaults (--kube-api-qps 50, --kube-api-burst 100, which
// is also the equal budget), csi-volmgr at the kubelet's 50/100, and
// csi-volmgr at its own defaults (100/400) — with csi-volmgr's flags
// otherwise at their defaults; csi-volmgr's clients share one token
// bucket, so its flags are its whole budget. --settled-object-resync=5m is
// a fourth column of the steady state only.
//
// Repeatable (scenario_test.go): each row runs EnvRuns times (default 3),
// the columns' order alternating between runs; every figure of every run
// is a sample of results.json (package benchresults: the commit, the
// machine's floors — nproc, CPU model, memory, kernel, load average before
// and after — the settings, every sample), and the tables show per column
// the median of the runs and their min–max. cmd/benchrender renders
// docs/performance.md's table and the charts from the committed copy.
//
// For attach-required drivers the world plays the attach/detach controller
// and external-attacher (attach_test.go): a VolumeAttachment marked
// attached and the volume in node.status.volumesAttached, the same objects
// for both agents. TestAgentsRestart and TestAttachRequired check the
// harness itself; TestPlan prints what will run and an estimate of how
// long (make bench-kubelet-plan).
//
// The benchmarks, in the order they run, and their knobs (environment):
//   - BenchmarkAPICost: requests per pod through a counting proxy in front
//     of kube-apiserver (proxy_test.go), heap growth with
//     KUBELET_BENCH_FOREIGN (20,000) foreign PVCs/PVs;
//   - BenchmarkAttachToStage: VolumeAttachment attached → NodeStageVolume,
//     a row per KUBELET_BENCH_ATTACH_LAGS (500ms,2s,10s), with
//     KUBELET_BENCH_ATTACH_PODS (5) pods each;
//   - BenchmarkBurst: KUBELET_BENCH_BURST (0,110,1000) pods bound at once
//     (cutoff KUBELET_BENCH_CUTOFF, 10m; teardown cutoff
//     KUBELET_BENCH_TEARDOWN_CUTOFF, 5m), memory per volume above the
//     agent with no pod after KUBELET_BENCH_BURST_IDLE (10s), restart at
//     KUBELET_BENCH_RESTART_AT (5000: the stress rows of make
//     bench-kubelet-stress), teardown;
//   - BenchmarkFloors: a GET, an fsync, a durable record, a mkdir, a bind
//     mount on this machine;
//   - BenchmarkKubeletBaseline: KUBELET_BENCH_PODS (30,110) pods created
//     one after another, added latency, own ready signal, CPU per pod,
//     memory after KUBELET_BENCH_IDLE (10s);
//   - BenchmarkSharedVolume: 50 pods on one RWX volume, 100 ms plugin;
//   - BenchmarkSteadyState: every column at KUBELET_BENCH_STEADY_PODS
//     (110,1000) volumes in one window of KUBELET_BENCH_STEADY_WINDOW
//     (15m), each on a Node of its own behind a counting proxy: CPU from
//     schedstat (ns), API requests per minute by verb, the analytic
//     requests per pod and minute of each agent's periods;
//   - BenchmarkWatchCost: kube-apiserver's memory and CPU per by-name
//     watch (KUBELET_BENCH_WATCHES, 10,000), extrapolated to 5,000 nodes ×
//     110 pods;
//   - BenchmarkZZSummary: the whole table.
//
// KUBELET_BENCH_IDENTITY (admin) is who both agents are on the API server
// (identity_test.go): admin, the API server's admin credentials under
// RBAC; or node, each the kubelet of the world's Node (system:node:<Node>
// in system:nodes) under --authorization-mode=Node,RBAC and NodeRestriction
// — the kubelet with the Node's client certificate in its kubeconfig,
// csi-volmgr with --node-identity and the same kind of certificate in its
// --cert-dir (no CSR: the harness holds the API server's Node client
// signer) — the world's own writes staying admin. The counting proxies then
// serve TLS, authenticate the agent by its certificate and forward as the
// same Node. Under node, the steady state has no watch-all column
// (--settled-object-resync=0 watches, which the Node authorizer forbids);
// results.json's settings name the identity ("agent identity").
//
// KUBELET_BENCH_RUNS (3) is the runs per row; KUBELET_BENCH_BUDGETS
// (equal,defaults) the column sets; KUBELET_BENCH_AGENTS=csi-volmgr runs
// one agent only, for work on it; KUBELET_BENCH_V sets both agents' -v
// (default 1), to see where a figure's time went. Everything goes to the
// results directory (KUBELET_BENCH_RESULTS: results.json, table.md, the
// charts, each agent's heap profiles and log).
package bench
