package volumemanager

import (
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

// Paths of the liveness checks. Both serve the same named checks; each
// check also answers alone under the path (e.g. /livez/lifecycle-steps),
// and ?verbose lists them, as the kube-apiserver's.
const (
	HealthzPath = "/healthz"
	LivezPath   = "/livez"
)

// DefaultPodWatchLivenessBound is how long the watch of the node's pods may
// fail without a break before the agent reports itself not alive. A
// restart does not bring an unreachable API server back, so it is long;
// it is there for credentials that stopped working and a client that
// stopped trying.
const DefaultPodWatchLivenessBound = 5 * time.Minute

// livenessChecks are the named checks of /healthz and /livez:
//
//   - lifecycle-steps: no worker is inside one lifecycle operation (its
//     lock wait, its CSI call, its mounts) without progress for longer than
//     twice the CSI call timeout (a hung mount or stat on a dead server);
//     each operation that returns, and the fsGroup walk's reports, are
//     progress;
//   - pod-watch: the watch of the node's pods has not failed without a
//     break for longer than Tuning.PodWatchLivenessBound (cluster mode).
func (vm *VolumeManager) livenessChecks() []healthz.HealthChecker {
	stepBound := vm.cfg.Tuning.StepLivenessBound
	if stepBound == 0 {
		timeout := vm.cfg.CSITimeout
		if timeout == 0 {
			timeout = csiclient.DefaultTimeout
		}
		stepBound = 2 * timeout
	}
	watchBound := vm.cfg.Tuning.PodWatchLivenessBound
	if watchBound == 0 {
		watchBound = DefaultPodWatchLivenessBound
	}
	return []healthz.HealthChecker{
		healthz.PingHealthz,
		healthz.NamedCheck("lifecycle-steps", func(*http.Request) error { return vm.manager.CheckSteps(stepBound) }),
		healthz.NamedCheck("pod-watch", func(*http.Request) error { return vm.manager.CheckPodWatch(watchBound) }),
	}
}

// installLiveness serves the liveness checks on mux at HealthzPath and
// LivezPath.
func (vm *VolumeManager) installLiveness(mux *routes) {
	checks := vm.livenessChecks()
	healthz.InstallPathHandler(mux, HealthzPath, checks...)
	healthz.InstallPathHandler(mux, LivezPath, checks...)
}
