// Package virtualnode keeps the Node object of a node that has no kubelet,
// for csi-volmgr run --register-node: it creates the Node (labels
// kubernetes.io/hostname, kubernetes.io/os and kubernetes.io/arch, and the
// annotation volumes.kubernetes.io/controller-managed-attach-detach=true so
// that the attach/detach controller attaches its volumes), and keeps it
// from being considered NotReady the way a kubelet does, with the minimum
// that is correct:
//
//   - the node Lease kube-node-lease/<node>, owned by the Node, is renewed
//     every 10s with a 40s duration (the kubelet's defaults, through the
//     same component-helpers lease controller). The node lifecycle
//     controller counts a renewed Lease as a heartbeat, so the Node stays
//     healthy as long as the agent runs (it marks the Node Unknown after
//     --node-monitor-grace-period, 50s by default, without one);
//   - the Ready condition is posted True at registration, put back as soon
//     as the Node watch shows it turned (after the agent was down, the
//     controller sets it Unknown and nothing else sets it back), and its
//     heartbeat re-posted every 5 minutes, the kubelet's
//     nodeStatusReportFrequency. The patch touches only that condition, so
//     status.volumesInUse (lifecycle/status) is left alone.
//
// Nothing else of the kubelet's node status is faked: no capacity, so no
// scheduler places pods there (the node runs no containers); pods reach it
// by spec.nodeName. A deleted Node is created again. Virtual-kubelet does
// the same with a 10s Lease and a 1 minute status period.
package virtualnode
