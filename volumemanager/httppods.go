package volumemanager

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Paths of the pod API that Handler serves, for runtimes that run beside
// the agent instead of embedding it.
const (
	// PodsPath lists every pod the agent holds volumes of (GET).
	PodsPath = "/api/v1/pods"
	// maxWait bounds the wait a request may ask for.
	maxWait = 10 * time.Minute
)

// The query parameters of the pod API.
const (
	// queryUID selects the pod by UID among pods of the same name.
	queryUID = "uid"
	// queryWait makes GET wait until the pod is "mounted" or "unmounted".
	queryWait = "wait"
	// queryTimeout bounds the wait (a Go duration); default 2m.
	queryTimeout = "timeout"
)

// registerPodAPI adds the pod API to mux:
//
//	GET  /api/v1/pods                                   every pod the agent holds
//	GET  /api/v1/pods/{namespace}/{name}[?uid=U]        one pod: state, blocking reason, mounted paths and devices
//	     ...&wait=mounted|unmounted[&timeout=2m]        the same once the pod's volumes are published (unpublished);
//	                                                    504 with the current state when the timeout ends first
//	POST /api/v1/pods/{namespace}/{name}/containers-stopped?uid=U
//	                                                    the runtime's "the pod's containers stopped" (202) of a pod
//	                                                    being deleted or gone (409 for a live pod or another name)
//	POST /api/v1/running-pods/begin                    the mark of a report, right before the runtime lists its pods
//	PUT  /api/v1/running-pods {"mark": M, "uids": [...]}
//	                                                    the runtime's report of the pods it still runs (204)
func (vm *VolumeManager) registerPodAPI(mux *routes) {
	mux.HandleFunc("GET "+PodsPath, func(w http.ResponseWriter, _ *http.Request) {
		out := []PodVolumes{}
		uids := append(vm.waiters.uids(), vm.manager.PodsAwaitingRuntime()...)
		slices.Sort(uids)
		for _, uid := range slices.Compact(uids) {
			if p, ok := vm.PodVolumes(uid); ok {
				out = append(out, p)
			}
		}
		slices.SortFunc(out, func(a, b PodVolumes) int {
			return strings.Compare(a.Namespace+"/"+a.Name+"/"+string(a.UID), b.Namespace+"/"+b.Name+"/"+string(b.UID))
		})
		writeJSON(w, out)
	})
	mux.HandleFunc("GET "+PodsPath+"/{namespace}/{name}", vm.getPod)
	mux.HandleFunc("POST "+PodsPath+"/{namespace}/{name}/containers-stopped", vm.postContainersStopped)
	mux.HandleFunc("POST "+RunningPodsBeginPath, vm.postRunningPodsBegin)
	mux.HandleFunc("PUT "+RunningPodsPath, vm.putRunningPods)
}

func (vm *VolumeManager) getPod(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	uid := types.UID(r.URL.Query().Get(queryUID))
	wait := r.URL.Query().Get(queryWait)
	timeout, err := waitTimeout(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if uid == "" {
		uid = vm.waiters.uidOf(ns, name)
	}
	if uid == "" && wait == "" {
		http.Error(w, fmt.Sprintf("the agent holds no volume of pod %s/%s", ns, name), http.StatusNotFound)
		return
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	switch wait {
	case "":
	case "mounted", "unmounted":
		if uid == "" {
			http.Error(w, "waiting needs the pod's uid", http.StatusBadRequest)
			return
		}
		// Exempt from the TCP server's write timeout, bounded by its
		// own (at most maxWait).
		extendForLongPoll(w, timeout, vm.longPollSlack())
		if wait == "mounted" {
			err = vm.WaitForAttachAndMount(ctx, pod)
		} else {
			err = vm.WaitForUnmount(ctx, pod)
		}
	default:
		http.Error(w, fmt.Sprintf("wait=%q: want mounted or unmounted", wait), http.StatusBadRequest)
		return
	}
	p, ok := vm.PodVolumes(uid)
	if !ok {
		p = PodVolumes{UID: uid, Namespace: ns, Name: name, State: PodVolumesGone, Volumes: []MountedVolume{}}
	}
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusGatewayTimeout)
		writeJSONBody(w, p)
		return
	}
	if !ok && wait == "" {
		http.Error(w, fmt.Sprintf("the agent holds no volume of pod %s/%s (uid %s)", ns, name, uid), http.StatusNotFound)
		return
	}
	writeJSON(w, p)
}

// waitTimeout reads the timeout parameter.
func waitTimeout(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get(queryTimeout)
	if v == "" {
		return 2 * time.Minute, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > maxWait {
		return 0, fmt.Errorf("timeout=%q: want a duration in (0, %v]", v, maxWait)
	}
	return d, nil
}
