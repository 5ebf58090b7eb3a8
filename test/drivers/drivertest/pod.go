package drivertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// VolumesReadyCondition is csi-volmgr's pod condition.
const VolumesReadyCondition corev1.PodConditionType = "csi-volmgr.io/VolumesReady"

// Poll waits for cond, every 200 ms and at most Timeout; the error names
// what it waited for.
func Poll(ctx context.Context, what string, cond wait.ConditionWithContextFunc) error {
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, Timeout, true, cond); err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	return nil
}

// VolumesReady says whether the pod's VolumesReady condition is True; a
// pod that cannot be read is not ready.
func VolumesReady(ctx context.Context, c kubernetes.Interface, namespace, name string) (bool, error) {
	p, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, nil
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == VolumesReadyCondition {
			return cond.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// PodGone is the condition that the pod no longer exists: after its
// deletion, the agent (--register-node) tore its volumes down and
// completed it.
func PodGone(c kubernetes.Interface, namespace, name string) wait.ConditionWithContextFunc {
	return func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}
}

// MountDevice returns the device of the file system at path: a path that
// shows another device later was unmounted and mounted again.
func MountDevice(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Dev, nil
}

// SameMount checks that path still shows the device MountDevice returned.
func SameMount(path string, dev uint64) error {
	now, err := MountDevice(path)
	if err != nil {
		return err
	}
	if now != dev {
		return fmt.Errorf("the pod's path is another mount (device %d, was %d): it was unpublished and published again", now, dev)
	}
	return nil
}

// TokenNotLogged checks that neither the service account token nor its
// signature alone (a token cut at its dots would still leak it) is in the
// agent's log, and that the log holds the CSI calls (-v=5) it was searched
// for.
func TokenNotLogged(logFile, token string) error {
	log, err := os.ReadFile(logFile)
	if err != nil {
		return err
	}
	if len(log) == 0 {
		return errors.New("the agent's log is empty: nothing to search")
	}
	sig := token[strings.LastIndex(token, ".")+1:]
	for what, s := range map[string]string{"the token": token, "the token's signature": sig} {
		if strings.Contains(string(log), s) {
			return fmt.Errorf("%s is in the agent's log %s", what, logFile)
		}
	}
	if !strings.Contains(string(log), "NodePublishVolume") {
		return errors.New("the agent's log has no NodePublishVolume: -v=5 logs the CSI calls, was it searched at all?")
	}
	return nil
}

// WarningEventSince is the condition that the pod has a Warning Event of
// reason whose last occurrence is at since or later (Events carry seconds):
// what the agent reports of a step that failed, e.g. a republish
// (FailedMount) while the node plugin is down.
func WarningEventSince(c kubernetes.Interface, pod *corev1.Pod, reason string, since time.Time) wait.ConditionWithContextFunc {
	since = since.Truncate(time.Second)
	return func(ctx context.Context) (bool, error) {
		evs, err := c.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String(),
		})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			last := e.LastTimestamp.Time
			if last.IsZero() {
				last = e.EventTime.Time
			}
			if e.Type == corev1.EventTypeWarning && e.Reason == reason && !last.Before(since) {
				return true, nil
			}
		}
		return false, nil
	}
}
