// Package fsgroup checks csi-volmgr's recursive fsGroup ownership change
// (lifecycle/fsgroup) against the kubelet's own code
// (k8s.io/kubernetes/pkg/volume VolumeOwnership), in the same process:
// TestOwnershipSameAsKubelet compares the result file by file,
// BenchmarkFSGroupOwnership times both on the same tree of 100,000 files.
package fsgroup
