// Package runtimepods keeps the runtime's word on which pods' containers
// may still run, for an agent beside a runtime (WaitForContainersStopped).
//
// The API server's word is not enough to unmount: a pod force-deleted
// (grace period 0) or removed by the pod garbage collector leaves the API
// server while its containers may still write to its volumes, and a
// publish found on disk after a restart may belong to such a pod. The
// kubelet asks its container runtime which pods still run before it
// unmounts; Pods does the same with what the runtime tells it.
//
// A pod that is not in the desired state is held — its volumes stay
// published, and so staged — until one of these released it:
//
//   - the runtime said its containers stopped (ContainersStopped), whatever
//     the API server says of the pod, even for a pod found only on disk;
//   - the runtime reported the pods it still runs (Running) and the pod is
//     not among them, in a report that came after the pod left the desired
//     state (for a pod found only on disk at start: any report);
//   - the API server showed the pod in a terminal phase (Terminal), which a
//     runtime beside the agent writes itself.
//
// A runtime that never reports keeps every such pod held: nothing of it is
// unmounted, Held gives the reason the status API shows, and Awaiting
// counts the pods for the csi_volmgr_pods_awaiting_runtime gauge.
package runtimepods
