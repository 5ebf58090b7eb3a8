// Package bench holds the benchmarks of the whole node agent that issue 4
// asks for: csi-volmgr's driver layer and lifecycle.Manager, wired as the
// `run` command wires them, against a real kube-apiserver and the real CSI
// test plugin over real plugin registration and real bind mounts. Its
// figures (pod-ready latency added by the agent, time against the
// driver-bound ideal) are printed with b.ReportMetric by `make bench`.
package bench
