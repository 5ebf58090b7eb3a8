// Package bench runs the real kubelet's volume manager and csi-volmgr one
// after the other on the same objects — one kube-apiserver (test/k8s), one
// Node, the CSI test plugin over real plugin registration and real bind
// mounts, the same PVCs and PVs — and prints each figure for both and
// their ratio (issue 17).
//
// Both agents run as processes of their own, started with command-line
// flags: kubelet-volumes (package kubeletvm: the kubelet's volumemanager,
// CSI plugin and plugin manager with the kubelet's defaults) and
// csi-volmgr's `run` command. Separate processes measure each agent's CPU
// time and memory as /proc reports them for that process alone, and keep
// the kubelet's CSI plugin globals (one set per process) apart from
// everything else. What either agent did is read from the plugin's
// journal, which costs neither agent anything; their HTTP endpoints are
// asked only outside the measured windows.
//
// For attach-required drivers the world plays the attach/detach controller
// and external-attacher (attach_test.go): a VolumeAttachment marked
// attached and the volume in node.status.volumesAttached, the same objects
// for both agents. TestAgentsRestart and TestAttachRequired check the
// harness itself (restart on the same root directory; attach-required
// volumes through the kubelet's node status stand-in).
//
// A row of the table is a scenario (scenario_test.go): a function that
// measures one started agent on the world and leaves the world as it
// found it; sideBySide runs it on each agent and prints the table. The
// benchmarks, in the order they run:
//   - BenchmarkAPICost: requests per pod through a counting proxy in front
//     of kube-apiserver (proxy_test.go), idle requests, heap growth with
//     20,000 foreign PVCs/PVs;
//   - BenchmarkAttachToStage: VolumeAttachment attached → NodeStageVolume;
//   - BenchmarkBurst: 1,000 to 10,000 pods bound at once (with a cutoff),
//     idle CPU, memory per volume above an agent with no pod, restart with
//     5,000 published volumes, teardown;
//   - BenchmarkFloors: a GET, an fsync, a durable record, a mkdir, a bind
//     mount on this machine;
//   - BenchmarkKubeletBaseline: pods created one after another, added
//     latency N = 1, 100, 1,000;
//   - BenchmarkSharedVolume: 50 pods on one RWX volume, 100 ms plugin;
//   - BenchmarkWatchCost: kube-apiserver's memory and CPU per by-name
//     watch, extrapolated to 5,000 nodes × 110 pods;
//   - BenchmarkZZSummary: the whole table.
//
// Every table also goes to the results directory (results_test.go:
// table.md, results.json, charts of latency and idle CPU against N as SVG
// and PNG, each agent's heap profiles, and each agent's log in logs/).
// KUBELET_BENCH_AGENTS=csi-volmgr runs one agent only, for work on it;
// KUBELET_BENCH_V sets both agents' -v (default 1), to see where a
// figure's time went.
package bench
