package kubeletvm

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"k8s.io/component-base/metrics/legacyregistry"
)

// Paths served by Handler. /healthz, /readyz and /metrics are the
// kubelet's; the two JSON paths have the shape of csi-volmgr's status API
// where they overlap (a list of objects with "name"), so that a benchmark
// reads both agents alike.
const (
	HealthzPath = "/healthz"
	ReadyzPath  = "/readyz"
	MetricsPath = "/metrics"
	DriversPath = "/api/v1/drivers"
	PodsPath    = "/api/v1/pods"
)

// Handler serves the harness's HTTP endpoint: /healthz (the process
// serves), /readyz (Ready), /metrics (the kubelet's legacy registry: the
// volume manager's and plugin manager's metrics, storage operation
// durations, the Go and process collectors), DriversPath (the registered
// CSI drivers), PodsPath (the pod workers' records) and /debug/pprof/.
func (k *Kubelet) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(HealthzPath, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc(ReadyzPath, func(w http.ResponseWriter, _ *http.Request) {
		if err := k.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	mux.Handle(MetricsPath, legacyregistry.Handler())
	mux.HandleFunc(DriversPath, func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, k.Drivers()) })
	mux.HandleFunc(PodsPath, func(w http.ResponseWriter, _ *http.Request) {
		pods := k.Pods()
		slices.SortFunc(pods, func(a, b PodRecord) int { return strings.Compare(string(a.UID), string(b.UID)) })
		writeJSON(w, pods)
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
