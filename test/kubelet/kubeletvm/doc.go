// Package kubeletvm runs the real kubelet's volume manager outside the
// kubelet, as the baseline csi-volmgr is measured against (issue 17).
//
// # What is real
//
// From k8s.io/kubernetes v1.37.2, unchanged and wired as NewMainKubelet
// wires them:
//   - pkg/kubelet/volumemanager: the desired-state populator, the
//     reconciler (with reconstruction after a restart), the operation
//     executor and generator, WaitForAttachAndMount / WaitForUnmount;
//   - pkg/volume/csi, the CSI volume plugin, with the other volume plugins
//     of the kubelet's list (cmd/kubelet/app/plugins.go), in its
//     VolumePluginMgr;
//   - pkg/kubelet/pluginmanager (plugin watcher, reconciler, operation
//     executor) with the CSI registration handler: the driver registers
//     through a registration socket exactly as with a kubelet, which writes
//     its node ID and topology into the Node and CSINode;
//   - pkg/kubelet/config: the pod source (a Reflector of the node's pods,
//     whose undelta store hands the whole list on each event) and
//     PodConfig, which turns it into ADD/UPDATE/DELETE/REMOVE;
//   - pkg/kubelet/pod: the pod manager;
//   - the kubelet's node informer (one Node), event recorder, mounter
//     (mount.New("")), host utils, subpather, token manager, and the
//     kubelet's configuration defaults and client settings (QPS 50, burst
//     100, protobuf; a heartbeat client without limit; an event client
//     with 50/100), from pkg/kubelet/apis/config/v1beta1.
//
// # What stands in, and why
//
// The kubelet's own type (pkg/kubelet.Kubelet) needs a container runtime,
// cAdvisor and cgroups, so the parts of it that the volume manager talks to
// are written here, each doing what the kubelet's does for volumes and
// nothing else:
//   - volumeHost (host.go) for kubeletVolumeHost: the kubelet's directory
//     layout, CSIDriver informer, Node from the node informer, storage
//     error; no secret, ConfigMap, ClusterTrustBundle or PodCertificate
//     manager (the benchmarks' pods use none);
//   - podWorkers (podworkers.go) for the pod workers, also the volume
//     manager's PodStateProvider: per pod, WaitForAttachAndMount at ADD, on
//     updates and every SyncFrequency (1 min ± 50 %), as SyncPod calls it;
//     at deletion, cancel, terminate at once (no containers), WaitForUnmount;
//   - syncLoop and housekeeping (kubelet.go) for the kubelet's syncLoop:
//     config updates into the pod manager and the pod workers; every 2 s
//     the pod workers' SyncKnownPods and cleanupOrphanedPodDirs;
//   - nodeStatusLoop (nodestatus.go) for the node status loop: every 10 s
//     only the real VolumesInUse setter, patched as the kubelet patches,
//     then MarkVolumesAsReportedInUse. The attach/detach controller's
//     node.status.volumesAttached, which the reconciler reads for
//     attachable volumes, is not written here: the benchmark writes it as
//     the controller would, so both agents see the same objects.
//
// Left out, as no part of volumes: the status manager (the real kubelet
// also spends API requests of the same 50 QPS budget on pod status, so
// these figures favor the kubelet), admission, the PLEG, probes, the
// flexvolume prober, volume stats (VolumeStatsAggPeriod) and the CSI
// volume health monitor (alpha, off).
//
// # One process per kubelet
//
// The CSI plugin keeps its drivers, node info manager and registration
// handler in package variables, as in the kubelet: one Kubelet per process.
// cmd/kubelet-volumes runs it as a process of its own, so that its CPU time
// and memory are measured as a process's, apart from csi-volmgr's and the
// benchmark's.
package kubeletvm
