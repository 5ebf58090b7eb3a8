// Package metrics holds the lifecycle's Prometheus collectors: the kubelet's
// storage_operation_duration_seconds and volume_manager_total_volumes (the
// latter computed at scrape time from the caller's stores), the client-go
// workqueue metrics of every named queue, and the latency from a pod event
// to the pod's volumes being ready.
//
// The kubelet's metrics are defined through k8s.io/component-base/metrics,
// as the kubelet defines them (names, help with the stability level,
// labels); Register and RegisterStable create them and register them into
// the prometheus.Registerer the caller gives, as everything else here:
// nothing uses a global registry.
package metrics
