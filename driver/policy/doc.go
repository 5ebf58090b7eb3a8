// Package policy caches the CSIDriver objects (storage.k8s.io/v1) of the
// cluster and turns each into the per-driver policy its user needs, by a
// function the user gives: the volume lifecycle passes its own
// (lifecycle/volume.PolicyFromCSIDriver, with the kubelet's defaults when no
// object exists), so the driver layer never depends on the lifecycle.
//
// A Store answers from an informer cache; subscribers are told which
// driver's policy changed so that they can re-evaluate that driver's volumes.
package policy
