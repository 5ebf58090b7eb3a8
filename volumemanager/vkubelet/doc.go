// Package vkubelet puts csi-volmgr under a virtual-kubelet provider
// (github.com/virtual-kubelet/virtual-kubelet v1.14.1): the provider keeps
// running the containers, the volume manager runs their CSI volumes.
//
// NewPodHandler wraps any provider's node.PodLifecycleHandler: CreatePod
// waits until the pod's volumes are published and passes their host paths
// and devices, SELinux contexts and groups on (MountedVolumes and
// ExtraSupplementalGroups of the context); DeletePod stops the
// containers first (the provider's DeletePod), then tells the volume
// manager they stopped, waits until the volumes are unpublished, and only
// then lets the pod's terminal status through, after which the pod
// controller deletes the pod from the API server — the kubelet's order.
//
// WithVolumeStats (or FillVolumeStats) adds the stats of the pods' CSI
// volumes to the stats summary the provider serves at /stats/summary.
//
// virtual-kubelet's NodeController owns the Node. NewNodeProvider and
// PrepareNode keep the Node it writes fit for CSI: it carries the
// attach/detach controller's annotation (without it the controller
// creates no VolumeAttachment for the node), and never status.volumesInUse,
// which the volume manager alone writes. The node controller patches the
// status three-way against the status it last applied
// (prepareThreewayPatchBytesForNodeStatus): a field it never applied is
// never removed by it, while a volumesInUse that slipped into a provider's
// Node (a copy of the Node read from the API server, say) would be applied
// and later reverted to that stale list, dropping volumes still mounted.
// The volume manager also re-writes volumesInUse whenever it sees the
// Node's list differ from what it wrote (Config.WaitForContainersStopped).
package vkubelet
