// Package metrics checks that csi-volmgr's volume metrics are the
// kubelet's: TestVolumeMetricsSameAsKubelet instantiates the definitions of
// k8s.io/kubernetes v1.37.2 (pkg/volume/util, pkg/kubelet/volumemanager/metrics,
// pkg/kubelet/metrics/collectors) and csi-volmgr's (lifecycle/metrics,
// lifecycle/stats, csiclient) in the same process, records one sample in
// each, and compares every family's name, type, help and label names.
package metrics
