package volumemanager

import (
	"fmt"
	"net/http"
)

// Access says who may call an endpoint on the TCP --http-endpoint. The API
// socket (SocketPath) serves every endpoint to whoever may open it: root.
type Access string

// The kinds of access of the TCP endpoint.
const (
	// AccessOpen: served to anyone (the health checks).
	AccessOpen Access = "open"
	// AccessAuthorized: served only to a caller authenticated by a client
	// certificate of the client CA or a bearer token of the agent's
	// audience (TokenReview), and authorized by the API server
	// (SubjectAccessReview on nodes/csi-volmgr of the agent's Node);
	// never in standalone mode.
	AccessAuthorized Access = "authorized"
	// AccessMetrics: served to anyone on a loopback endpoint; elsewhere
	// only to a caller authenticated as above and authorized for get on
	// nodes/metrics of the agent's Node (the kubelet's /metrics), never
	// in standalone mode.
	AccessMetrics Access = "open on loopback, else nodes/metrics"
)

// Endpoint is one route of Handler.
type Endpoint struct {
	// Pattern is the route as registered on the http.ServeMux: a method
	// and a path, or a path alone (any method).
	Pattern string
	// Access is who may call it on the TCP endpoint.
	Access Access
	// Profiling marks a route served only with Config.Profiling.
	Profiling bool
	// Doc says what it serves, in one sentence.
	Doc string
}

// Endpoints is every route Handler serves. Handler registers its routes
// through this table and panics on a route missing from it, so the table
// (and the reference generated from it, docs/reference/http.md) cannot
// drift from what is served.
var Endpoints = []Endpoint{
	{Pattern: "GET /metrics", Access: AccessMetrics, Doc: "Prometheus metrics (docs/reference/metrics.md)."},
	{Pattern: HealthzPath, Access: AccessOpen, Doc: "Liveness: 200 when every named check passes (`?verbose` lists them, `?exclude=NAME` skips one)."},
	{Pattern: HealthzPath + "/ping", Access: AccessOpen, Doc: "The ping check alone: the HTTP server answers."},
	{Pattern: HealthzPath + "/lifecycle-steps", Access: AccessOpen, Doc: "No worker is inside one lifecycle step, without progress, for longer than twice the CSI call timeout."},
	{Pattern: HealthzPath + "/pod-watch", Access: AccessOpen, Doc: "The watch of the node's pods has not failed without a break for longer than its bound (5m; cluster mode)."},
	{Pattern: LivezPath, Access: AccessOpen, Doc: "The same checks as /healthz."},
	{Pattern: LivezPath + "/ping", Access: AccessOpen, Doc: "The ping check alone."},
	{Pattern: LivezPath + "/lifecycle-steps", Access: AccessOpen, Doc: "The lifecycle-steps check alone."},
	{Pattern: LivezPath + "/pod-watch", Access: AccessOpen, Doc: "The pod-watch check alone."},
	{Pattern: "GET /readyz", Access: AccessOpen, Doc: "Readiness: 200 once the agent owns its Node (with --register-node: registered it), rebuilt its state from disk and synced its caches; 503 with the reason otherwise, e.g. node <name> not registered yet."},
	{Pattern: "GET " + VolumesPath, Access: AccessAuthorized, Doc: "Every volume the agent holds: driver, handle, stage state, pods and their publish state, last errors, stats (JSON)."},
	{Pattern: "GET " + DriversPath, Access: AccessAuthorized, Doc: "Every registered CSI driver: endpoint, versions, node ID, topology, capabilities (JSON)."},
	{Pattern: "GET " + ReconstructionPath, Access: AccessAuthorized, Doc: "What the agent found on disk at start: staged and published volumes, intact or not, records of an older format migrated, failures (JSON)."},
	{Pattern: "GET " + VersionPath, Access: AccessAuthorized, Doc: "The build: git version, commit, tree state, build date, Go version, platform (JSON, as `csi-volmgr version -o json`)."},
	{Pattern: "GET " + PodsPath, Access: AccessAuthorized, Doc: "Every pod the agent holds volumes of: state, reason, volumes (JSON)."},
	{Pattern: "GET " + PodsPath + "/{namespace}/{name}", Access: AccessAuthorized, Doc: "One pod (`?uid=`): state, blocking reason, mounted paths and devices, groups; `?wait=mounted|unmounted&timeout=2m` waits (504 with the current state when the timeout ends first)."},
	{Pattern: "POST " + PodsPath + "/{namespace}/{name}/containers-stopped", Access: AccessAuthorized, Doc: "The runtime's word that the pod's containers stopped (`?uid=` required): 202; its volumes may then be torn down. Only for a pod being deleted or terminal, or gone from the API server: 409 for a live pod or a UID of another namespace/name, 404 for a UID the agent does not know, 503 (Retry-After) until the agent has listed the node's pods."},
	{Pattern: "POST " + RunningPodsBeginPath, Access: AccessAuthorized, Doc: "The mark of a running-pods report, `{\"mark\":\"...\"}`: call it right before the runtime lists its pods, and send the mark with the list."},
	{Pattern: "PUT " + RunningPodsPath, Access: AccessAuthorized, Doc: "The runtime's report of the pods it still runs, `{\"mark\":\"...\",\"uids\":[...]}` with the mark of `POST /api/v1/running-pods/begin`: 204; a held pod not in it that left the API server before the mark is released. 400 without a mark, 409 for a mark of an earlier run of the agent."},
	{Pattern: "GET /debug/pprof/", Access: AccessAuthorized, Profiling: true, Doc: "Go's profiles: the index and every named profile (heap, goroutine, ...)."},
	{Pattern: "GET /debug/pprof/cmdline", Access: AccessAuthorized, Profiling: true, Doc: "The command line."},
	{Pattern: "GET /debug/pprof/profile", Access: AccessAuthorized, Profiling: true, Doc: "A CPU profile (`?seconds=`)."},
	{Pattern: "GET /debug/pprof/symbol", Access: AccessAuthorized, Profiling: true, Doc: "Symbols of program counters."},
	{Pattern: "GET /debug/pprof/trace", Access: AccessAuthorized, Profiling: true, Doc: "An execution trace (`?seconds=`)."},
}

// routes registers Handler's routes on a mux, each only if Endpoints has
// it, and remembers what it registered.
type routes struct {
	mux        *http.ServeMux
	known      map[string]bool
	registered []string
}

func newRoutes(mux *http.ServeMux) *routes {
	known := make(map[string]bool, len(Endpoints))
	for _, e := range Endpoints {
		known[e.Pattern] = true
	}
	return &routes{mux: mux, known: known}
}

// Handle registers h at pattern; a pattern missing from Endpoints is a
// programming error.
func (r *routes) Handle(pattern string, h http.Handler) {
	if !r.known[pattern] {
		panic(fmt.Sprintf("volumemanager: route %q is not in Endpoints", pattern))
	}
	r.registered = append(r.registered, pattern)
	r.mux.Handle(pattern, h)
}

// HandleFunc registers f at pattern, as Handle.
func (r *routes) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	r.Handle(pattern, http.HandlerFunc(f))
}
