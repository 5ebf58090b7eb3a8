package lifecycle

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// nodeEventRecorder records Events on the agent's Node; the modes' Events
// (*status.Events) implement it.
type nodeEventRecorder interface {
	Node(eventType, reason, message string)
}

// DriverRegistrationFailed records that a CSI driver's registration was
// rejected: a Warning Event DriverRegistrationFailed on the Node, where
// `kubectl describe node` shows it (in standalone mode, a log line). The
// kubelet only logs this. The wiring calls it for every rejection the
// driver registry reports; repeats of one rejection, retried with backoff,
// are counted on one Event by the Events' correlator. driver is empty when
// the registrar did not answer with a usable name.
func (m *Manager) DriverRegistrationFailed(driver, socket string, err error) {
	rec, ok := m.mode.inputs().events.(nodeEventRecorder)
	if !ok {
		return
	}
	var msg string
	if driver == "" {
		msg = fmt.Sprintf("The plugin registration socket %s was not registered: %v", socket, err)
	} else {
		msg = fmt.Sprintf("CSI driver %q (registration socket %s) was not registered: %v", driver, socket, err)
	}
	rec.Node(corev1.EventTypeWarning, status.EventDriverRegistrationFailed, msg)
}
