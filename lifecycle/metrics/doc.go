// Package metrics holds the lifecycle's Prometheus collectors: the kubelet's
// storage_operation_duration_seconds and volume_manager_total_volumes (the
// latter computed at scrape time from the caller's stores), the client-go
// workqueue metrics of every named queue, and the latency from a pod event
// to the pod's volumes being ready.
//
// Everything registers into the prometheus.Registerer the caller gives;
// nothing uses a global registry.
package metrics
