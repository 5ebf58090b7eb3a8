// Package status writes what people look at to see how a node's volumes are
// doing: the pod condition csi-volmgr.io/VolumesReady (whose reason and
// message name the step and volume that block the pod), Events with the
// kubelet's reasons (FailedMount, FailedMapVolume, ...) on pods and on the
// Node, and the Node's status.volumesInUse, which the attach/detach
// controller reads before it detaches a volume.
//
// Callers hand in plain values (lifecycle/volume types and PodVolumesStatus);
// every API write is a patch that touches only the fields this package owns,
// made from a rate-limited workqueue so that the latest desired value wins,
// bursts coalesce and failures back off.
package status
