// Package policy turns CSIDriver objects (storage.k8s.io/v1) into the
// per-driver behaviour the volume lifecycle needs: whether volumes must be
// attached, whether pod information and service account tokens are passed on
// publish, how fsGroup is applied and which volume lifecycle modes are allowed.
//
// A Store answers from an informer cache and falls back to the kubelet's
// defaults when no CSIDriver object exists; subscribers are told which driver's
// policy changed so that they can re-evaluate that driver's volumes.
package policy
