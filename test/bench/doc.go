// Package bench holds the benchmarks of the whole node agent: the volume
// manager the `run` command runs (volumemanager), against a real kube-apiserver and the real CSI
// test plugin over real plugin registration and real bind mounts. Its
// figures (pod-ready latency added by the agent, time against the
// driver-bound ideal) are printed with b.ReportMetric by `make bench`.
package bench
