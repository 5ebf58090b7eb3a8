package volumemanager

import (
	"errors"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Why a containers-stopped signal over HTTP is refused (checkStopped).
var (
	// errStopUnknownPod: the agent knows nothing of the pod (404): neither
	// the API server's cache, nor the desired state, nor a volume of it.
	// A signal for a pod not cached yet would otherwise be kept for it.
	errStopUnknownPod = errors.New("the agent knows no pod of that uid")
	// errStopOtherPod: the UID is another pod's (409).
	errStopOtherPod = errors.New("the uid is not the uid of the pod named in the path")
	// errStopLivePod: the API server has the pod, not marked for deletion
	// nor terminal (409): its volumes are wanted, whatever is said of its
	// containers.
	// errStopNotSynced: the node's pods have not been listed yet (503): a
	// pod the agent has not read may be a live one.
	errStopNotSynced = errors.New("the agent has not listed the node's pods yet (an API server outage at start?); ask again")
	errStopLivePod   = errors.New("the pod is not being deleted: the API server has it without a deletionTimestamp, " +
		"and not in a terminal phase; containers-stopped is for a pod being deleted or gone from the API server")
)

// postContainersStopped takes the runtime's word that the containers of
// pod namespace/name, with the UID ?uid=, stopped: 202 once recorded, 400
// without a UID, 404 and 409 as checkStopped refuses it.
func (vm *VolumeManager) postContainersStopped(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	uid := types.UID(r.URL.Query().Get(queryUID))
	if uid == "" {
		// A name alone could name the pod's successor, whose volumes must stay.
		http.Error(w, "the pod's uid is required", http.StatusBadRequest)
		return
	}
	if err := vm.checkStopped(uid, ns, name); err != nil {
		code := http.StatusConflict
		switch {
		case errors.Is(err, errStopUnknownPod):
			code = http.StatusNotFound
		case errors.Is(err, errStopNotSynced):
			code = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, fmt.Sprintf("containers-stopped of pod %s/%s (uid %s) refused: %v", ns, name, uid, err), code)
		return
	}
	vm.ContainersStopped(uid)
	w.WriteHeader(http.StatusAccepted)
}

// checkStopped says whether the runtime's word that the containers of the
// pod uid, named namespace/name, stopped may be taken. It may for a pod
// that is being deleted (deletionTimestamp) or terminal, and for one gone
// from the API server (or the manifests) whose volumes the agent still
// holds or wants, never for a live pod the API server has: a signal by UID
// alone let whoever may call the API tear down the volumes of any pod
// under its running containers. Where the agent knows the pod's name — in
// the API server's cache, the desired state, or the volumes it tears down
// — it must be namespace/name. A pod found only on disk at start has no
// name the agent knows: its UID is enough. Nothing is taken before the
// node's pods were listed: until then a live pod looks gone.
func (vm *VolumeManager) checkStopped(uid types.UID, namespace, name string) error {
	if !vm.manager.SourcesSynced() {
		return errStopNotSynced
	}
	if pod, ok := vm.manager.SourcePod(uid); ok {
		if pod.Namespace != namespace || pod.Name != name {
			return errStopOtherPod
		}
		if pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			return errStopLivePod
		}
		return nil
	}
	// Gone from the API server, or never cached yet.
	info, named := vm.waiters.name(uid)
	if d, wanted := vm.manager.DesiredPod(uid); wanted && !named {
		info, named = d.Info, true
	}
	switch {
	case named:
		if info.Namespace != namespace || info.Name != name {
			return errStopOtherPod
		}
		return nil
	case len(vm.manager.PodVolumes(uid)) > 0:
		return nil // found on disk at start
	default:
		return errStopUnknownPod
	}
}
