package volumemanager

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo"
)

// Paths of the JSON status API that Handler serves.
const (
	VolumesPath        = "/api/v1/volumes"
	DriversPath        = "/api/v1/drivers"
	ReconstructionPath = "/api/v1/reconstruction"
	// VersionPath is the build's version (buildinfo.Get).
	VersionPath = "/api/v1/version"
)

// VolumeStatus is one volume in the JSON status API.
type VolumeStatus struct {
	Name       string `json:"name"`
	Driver     string `json:"driver"`
	Handle     string `json:"handle"`
	PVName     string `json:"pvName,omitempty"`
	AccessType string `json:"accessType"`
	Attached   bool   `json:"attached"`
	// State is the stage state: NotStaged, StageUncertain or Staged.
	State         string      `json:"state"`
	StagingPath   string      `json:"stagingPath,omitempty"`
	Reconstructed bool        `json:"reconstructed,omitempty"`
	Pods          []PodStatus `json:"pods"`
	LastError     *ErrorInfo  `json:"lastError,omitempty"`
	// Stats is the volume's last usage and health from its driver.
	Stats *VolumeStatsStatus `json:"stats,omitempty"`
}

// PodStatus is one pod's publish of a volume in the JSON status API.
type PodStatus struct {
	UID string `json:"uid"`
	// Namespace and Name are the pod's, when the agent knows them (not for
	// a publish found on disk at start whose pod is gone).
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	// State is the publish state: NotPublished, PublishUncertain or Published.
	State      string     `json:"state"`
	TargetPath string     `json:"targetPath,omitempty"`
	LastError  *ErrorInfo `json:"lastError,omitempty"`
}

// ErrorInfo is a step's last error and when it happened.
type ErrorInfo struct {
	Step    string    `json:"step"`
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
}

// DriverStatus is one registered driver in the JSON status API.
type DriverStatus struct {
	Name               string            `json:"name"`
	Endpoint           string            `json:"endpoint"`
	Version            string            `json:"version"`
	SupportedVersions  []string          `json:"supportedVersions"`
	NodeID             string            `json:"nodeID"`
	MaxVolumes         int64             `json:"maxVolumes"`
	Topology           map[string]string `json:"topology,omitempty"`
	Capabilities       []string          `json:"capabilities,omitempty"`
	RegistrationSocket string            `json:"registrationSocket"`
	RegisteredAt       time.Time         `json:"registeredAt"`
}

// ReconstructionStatus is what the agent found on disk at start, in the
// JSON status API.
type ReconstructionStatus struct {
	Staged          int `json:"staged"`
	StagedIntact    int `json:"stagedIntact"`
	Published       int `json:"published"`
	PublishedIntact int `json:"publishedIntact"`
	// Migrated counts the records of an older format rewritten in the
	// current one at this start (docs/operations.md, "Upgrades and
	// rollbacks").
	Migrated int      `json:"migrated,omitempty"`
	Failed   []string `json:"failed,omitempty"`
}

// Handler serves /metrics (Prometheus), /healthz and /livez (the named
// liveness checks of livenessChecks), /readyz (Ready; the body says why
// not, e.g. the Node is not registered yet or does not carry OwnerLabel)
// and the
// JSON status API: VolumesPath, DriversPath and ReconstructionPath; with
// Config.Profiling also /debug/pprof/. It checks no credentials: whoever
// reaches it may tear volumes down (the pod API). Run serves it on the API
// socket (SocketPath) only; the TCP endpoint serves its /api/ and
// /debug/pprof/ to callers the API server authorized (apiauth) only.
func (vm *VolumeManager) Handler() http.Handler {
	mux := http.NewServeMux()
	vm.register(newRoutes(mux))
	return mux
}

// register adds Handler's routes, each of which Endpoints lists.
func (vm *VolumeManager) register(mux *routes) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(vm.Metrics(), promhttp.HandlerOpts{}))
	vm.installLiveness(mux)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if vm.node != nil {
			if registering, reason := vm.node.Registering(); registering {
				http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
				return
			}
		}
		if owned, reason := vm.NodeOwned(); !owned {
			http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
			return
		}
		if !vm.Ready() {
			http.Error(w, "not ready: reconstructing state or waiting for informers to sync", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+VolumesPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, vm.withStats(volumeStatuses(vm.manager.Snapshot(), vm.waiters.name)))
	})
	mux.HandleFunc("GET "+DriversPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, driverStatuses(r, vm.registry.List()))
	})
	mux.HandleFunc("GET "+ReconstructionPath, func(w http.ResponseWriter, r *http.Request) {
		res := vm.manager.Reconstruction()
		rs := ReconstructionStatus{Staged: res.Staged, StagedIntact: res.ProvenStaged, Published: res.Published, PublishedIntact: res.ProvenPublished,
			Migrated: res.Migrated}
		for _, err := range res.Failed {
			rs.Failed = append(rs.Failed, err.Error())
		}
		writeJSON(w, rs)
	})
	mux.HandleFunc("GET "+VersionPath, func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, buildinfo.Get()) })
	vm.registerPodAPI(mux)
	if vm.cfg.Profiling {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	writeJSONBody(w, v)
}

func writeJSONBody(w http.ResponseWriter, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func volumeStatuses(vols []asw.VolumeStatus, podName func(types.UID) (volume.PodInfo, bool)) []VolumeStatus {
	out := make([]VolumeStatus, 0, len(vols))
	for _, v := range vols {
		vs := VolumeStatus{
			Name: string(v.Name), Driver: v.Driver, Handle: v.Handle, PVName: v.PVName,
			AccessType: v.AccessType.String(), Attached: v.Attached, State: v.Stage.String(),
			StagingPath: v.StagingPath, Reconstructed: v.Reconstructed, Pods: []PodStatus{},
			LastError: errorInfo(v.LastError),
		}
		for _, p := range v.Pods {
			ps := PodStatus{UID: string(p.Key.Pod), State: p.State.String(), TargetPath: p.TargetPath, LastError: errorInfo(p.LastError)}
			if info, ok := podName(p.Key.Pod); ok {
				ps.Namespace, ps.Name = info.Namespace, info.Name
			}
			vs.Pods = append(vs.Pods, ps)
		}
		slices.SortFunc(vs.Pods, func(a, b PodStatus) int { return strings.Compare(a.UID, b.UID) })
		out = append(out, vs)
	}
	slices.SortFunc(out, func(a, b VolumeStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func errorInfo(f *asw.Failure) *ErrorInfo {
	if f == nil || f.Err == nil {
		return nil
	}
	return &ErrorInfo{Step: string(f.Step), Message: f.Err.Error(), Time: f.Time}
}

func driverStatuses(r *http.Request, drivers []registry.Driver) []DriverStatus {
	out := make([]DriverStatus, 0, len(drivers))
	for _, d := range drivers {
		ds := DriverStatus{
			Name: d.Name, Endpoint: d.Endpoint, Version: d.Version, SupportedVersions: d.SupportedVersions,
			NodeID: d.NodeID, MaxVolumes: d.MaxVolumes, Topology: d.Topology,
			RegistrationSocket: d.RegistrationSocket, RegisteredAt: d.RegisteredAt,
		}
		if caps, err := d.Client.NodeCapabilities(r.Context()); err == nil {
			for _, c := range caps.Types() {
				ds.Capabilities = append(ds.Capabilities, c.String())
			}
		}
		out = append(out, ds)
	}
	return out
}
