package vkubelet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// DefaultMountTimeout is how long CreatePod waits for the pod's volumes
// before it fails (and the pod controller retries with backoff): the
// kubelet's two minutes.
const DefaultMountTimeout = 2 * time.Minute

// VolumeManager is what the wrapper needs of the volume manager;
// *volumemanager.VolumeManager implements it.
type VolumeManager interface {
	WaitForAttachAndMount(ctx context.Context, pod *corev1.Pod) error
	GetMountedVolumesForPod(uid types.UID) map[string]volumemanager.MountedVolume
	GetExtraSupplementalGroupsForPod(pod *corev1.Pod) []int64
	ContainersStopped(uid types.UID)
	BeginRunningPods() func(uids []types.UID)
	WaitForUnmount(ctx context.Context, pod *corev1.Pod) error
	PodVolumes(uid types.UID) (volumemanager.PodVolumes, bool)
}

var _ VolumeManager = &volumemanager.VolumeManager{}

// Config configures the pod handler.
type Config struct {
	// Volumes is the volume manager, run with
	// Config.WaitForContainersStopped. Required.
	Volumes VolumeManager
	// MountTimeout bounds CreatePod's wait for the volumes; 0 means
	// DefaultMountTimeout. A waiting CreatePod holds one of the pod
	// controller's workers: give it as many workers as pods may wait for
	// their volumes at once.
	MountTimeout time.Duration
	// UnmountTimeout bounds DeletePod's wait for the unmount; 0 means
	// DefaultMountTimeout. The pod controller calls DeletePod again after
	// an error.
	UnmountTimeout time.Duration
}

type mountedKey struct{}

// mounted is what CreatePod of a wrapped provider receives in its context.
type mounted struct {
	volumes map[string]volumemanager.MountedVolume
	groups  []int64
}

// MountedVolumes returns the pod's published volumes by the pod's name for
// them, as CreatePod of a wrapped provider receives them in its context:
// host path or device, read-only, the SELinux context each was mounted
// with and the group its PersistentVolume asks for.
func MountedVolumes(ctx context.Context) (map[string]volumemanager.MountedVolume, bool) {
	m, ok := ctx.Value(mountedKey{}).(mounted)
	return m.volumes, ok
}

// ExtraSupplementalGroups returns the groups that CreatePod of a wrapped
// provider adds to the supplemental groups of every container of the pod
// (after the pod's securityContext.supplementalGroups and fsGroup): those
// its volumes ask for and the pod does not already have, as the kubelet
// adds them (GetExtraSupplementalGroupsForPod).
func ExtraSupplementalGroups(ctx context.Context) []int64 {
	m, _ := ctx.Value(mountedKey{}).(mounted)
	return m.groups
}

// NewPodHandler wraps provider so that its pods get their CSI volumes; see
// the package documentation. The result implements node.PodNotifier
// exactly when provider does.
func NewPodHandler(provider node.PodLifecycleHandler, cfg Config) (node.PodLifecycleHandler, error) {
	if provider == nil || cfg.Volumes == nil {
		return nil, errors.New("vkubelet: a provider and a volume manager are required")
	}
	if cfg.MountTimeout == 0 {
		cfg.MountTimeout = DefaultMountTimeout
	}
	if cfg.UnmountTimeout == 0 {
		cfg.UnmountTimeout = DefaultMountTimeout
	}
	h := &podHandler{PodLifecycleHandler: provider, cfg: cfg, deleting: map[types.UID]*corev1.Pod{}, since: map[types.UID]transition{}}
	if n, ok := provider.(node.PodNotifier); ok {
		return &notifyingPodHandler{podHandler: h, notifier: n}, nil
	}
	return h, nil
}

// podHandler wraps a provider without status notifications: the pod
// controller's own wrapper reports the terminal status once DeletePod
// returned, which is after the unmount.
type podHandler struct {
	node.PodLifecycleHandler
	cfg Config

	// mu guards deleting and notify.
	mu sync.Mutex
	// deleting holds the pods in DeletePod, with the terminal status the
	// provider reported meanwhile (nil while none).
	deleting map[types.UID]*corev1.Pod
	notify   func(*corev1.Pod)
	// since is when each pod's VolumesReady condition took its status.
	since map[types.UID]transition
}

type transition struct {
	status corev1.ConditionStatus
	at     metav1.Time
}

// CreatePod waits for the pod's volumes, then creates the pod in the
// provider with the volumes in its context (MountedVolumes).
func (h *podHandler) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	wctx, cancel := context.WithTimeout(ctx, h.cfg.MountTimeout)
	defer cancel()
	if err := h.cfg.Volumes.WaitForAttachAndMount(wctx, pod); err != nil {
		return fmt.Errorf("unmounted volumes: %w", err)
	}
	m := mounted{volumes: h.cfg.Volumes.GetMountedVolumesForPod(pod.UID), groups: h.cfg.Volumes.GetExtraSupplementalGroupsForPod(pod)}
	return h.PodLifecycleHandler.CreatePod(context.WithValue(ctx, mountedKey{}, m), pod)
}

// DeletePod stops the pod's containers (the provider's DeletePod), tells
// the volume manager, waits until the volumes are unpublished and then
// lets the terminal status the provider reported through.
func (h *podHandler) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	h.mu.Lock()
	if _, ok := h.deleting[pod.UID]; !ok {
		h.deleting[pod.UID] = nil
	}
	h.mu.Unlock()
	err := h.PodLifecycleHandler.DeletePod(ctx, pod)
	if err != nil && !errdefs.IsNotFound(err) {
		h.release(pod.UID, false)
		return err
	}
	// Stopped (or never created: CreatePod may have failed on its volumes).
	h.cfg.Volumes.ContainersStopped(pod.UID)
	reportRunningPods(ctx, h.PodLifecycleHandler, h.cfg.Volumes)
	wctx, cancel := context.WithTimeout(ctx, h.cfg.UnmountTimeout)
	defer cancel()
	if uerr := h.cfg.Volumes.WaitForUnmount(wctx, pod); uerr != nil {
		h.release(pod.UID, false)
		return uerr
	}
	klog.FromContext(ctx).V(2).Info("Pod's containers stopped and its volumes unmounted", "pod", klog.KObj(pod), "podUID", pod.UID)
	h.release(pod.UID, true)
	return err
}

// release ends a DeletePod; after an unmount it reports the terminal
// status held back meanwhile.
func (h *podHandler) release(uid types.UID, unmounted bool) {
	h.mu.Lock()
	held := h.deleting[uid]
	delete(h.deleting, uid)
	if unmounted {
		delete(h.since, uid)
	}
	notify := h.notify
	h.mu.Unlock()
	switch {
	case held == nil || notify == nil:
	case unmounted:
		notify(held)
	default:
		// DeletePod failed: the pod controller calls it again; keep the
		// status for that call.
		h.mu.Lock()
		if _, again := h.deleting[uid]; !again {
			h.deleting[uid] = held
		}
		h.mu.Unlock()
	}
}

// notifyingPodHandler wraps a provider that reports pod statuses itself.
type notifyingPodHandler struct {
	*podHandler
	notifier node.PodNotifier
}

// NotifyPods passes the provider's pod statuses on, except the terminal
// status of a pod being deleted: that one waits until its volumes are
// unmounted, since the pod controller deletes a terminal pod from the API
// server at once.
func (h *notifyingPodHandler) NotifyPods(ctx context.Context, cb func(*corev1.Pod)) {
	h.mu.Lock()
	h.notify = cb
	h.mu.Unlock()
	h.notifier.NotifyPods(ctx, func(pod *corev1.Pod) {
		if terminal(pod) {
			h.mu.Lock()
			if _, deleting := h.deleting[pod.UID]; deleting {
				h.deleting[pod.UID] = pod.DeepCopy()
				h.mu.Unlock()
				return
			}
			// Ended by itself: its volumes go with its terminal phase.
			delete(h.since, pod.UID)
			h.mu.Unlock()
		}
		cb(h.withVolumesReady(pod))
	})
}

// GetPodStatus adds the VolumesReady condition to the provider's status.
func (h *podHandler) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	st, err := h.PodLifecycleHandler.GetPodStatus(ctx, namespace, name)
	if err != nil || st == nil {
		return st, err
	}
	pod, err := h.GetPod(ctx, namespace, name)
	if err != nil || pod == nil {
		return st, nil //nolint:nilerr // the status without the condition
	}
	pod = pod.DeepCopy()
	pod.Status = *st.DeepCopy()
	return &h.withVolumesReady(pod).Status, nil
}

// withVolumesReady adds the volume manager's csi-volmgr.io/VolumesReady
// condition to a status the provider reports: the pod controller replaces
// the pod's whole status with it (UpdateStatus), which would drop the
// condition the volume manager wrote.
func (h *podHandler) withVolumesReady(pod *corev1.Pod) *corev1.Pod {
	pv, ok := h.cfg.Volumes.PodVolumes(pod.UID)
	if !ok || pv.State == volumemanager.PodVolumesTearingDown || pv.State == volumemanager.PodVolumesAwaitingRuntime {
		return pod
	}
	cond := corev1.PodCondition{Type: status.ConditionVolumesReady, Status: corev1.ConditionTrue}
	if pv.State != volumemanager.PodVolumesReady {
		cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, pv.Reason, pv.Message
	}
	h.mu.Lock()
	t, ok := h.since[pod.UID]
	if !ok || t.status != cond.Status {
		t = transition{status: cond.Status, at: metav1.Now()}
		h.since[pod.UID] = t
	}
	h.mu.Unlock()
	cond.LastTransitionTime = t.at
	pod = pod.DeepCopy()
	conds := make([]corev1.PodCondition, 0, len(pod.Status.Conditions)+1)
	for _, c := range pod.Status.Conditions {
		if c.Type != cond.Type {
			conds = append(conds, c)
		}
	}
	pod.Status.Conditions = append(conds, cond)
	return pod
}

// terminal says whether the pod's status says its containers are done.
func terminal(pod *corev1.Pod) bool {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return true
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Terminated == nil {
			return false
		}
	}
	return len(pod.Status.ContainerStatuses) > 0
}
