// Package dsw is the desired state of world: which volumes the pods on this
// node want, with their sources and per-pod uses, which pods are known, and
// why some of a pod's volumes could not be resolved. It is a thread-safe
// store that computes and calls nothing except its subscribers' callbacks,
// which receive the keys whose desired entry changed so that the reconciler
// enqueues exactly those.
package dsw
