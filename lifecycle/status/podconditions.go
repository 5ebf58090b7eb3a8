package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// PodConditionsQueueName names the pod condition queue in workqueue metrics.
const PodConditionsQueueName = "csi_volmgr_pod_conditions"

// DefaultPendingDelay is how long an in-progress status waits before it is
// written: a pod whose volumes are published within it gets a single write
// (True), instead of one per step (waiting for stage, for publish, True),
// which at the agent's API rate limit would cost three times the writes and
// delay other pods' conditions.
const DefaultPendingDelay = time.Second

// PodConditionsConfig configures a PodConditions writer.
type PodConditionsConfig struct {
	// Client patches pods/status. Required.
	Client kubernetes.Interface
	// CachedPod returns the pod from the caller's informer cache, or nil
	// when the cache does not hold it. Optional: when set, a pod whose
	// cached condition already matches is not written, and an unchanged
	// status keeps its lastTransitionTime across agent restarts. The pod
	// must not be modified.
	CachedPod func(namespace, name string) *corev1.Pod
	// Clock stamps lastTransitionTime; nil is the real clock.
	Clock clock.PassiveClock
	// PendingDelay is how long a Pending status (a step in progress, no
	// error) waits before it is written, in case a newer status replaces
	// it: zero is DefaultPendingDelay, negative writes it at once. Ready
	// and failed statuses are always written at once.
	PendingDelay time.Duration
	// Queue tunes the workqueue.
	Queue QueueOptions
	// Gate, when set, holds every write back while it is closed (the
	// agent does not own its Node).
	Gate Gate
}

// PodConditions writes ConditionVolumesReady on pods.
//
// Set records the latest wanted status of a pod and enqueues the pod; a
// worker writes it unless it equals what was last written (or, before the
// first write, what the informer cache shows). Only the latest status of a
// pod is ever written, and a failed write is retried with backoff.
//
// Writes are strategic merge patches of pods/status whose conditions list
// holds only this condition: status.conditions merges by type, so the
// conditions of other writers (a kubelet's Ready, a scheduler's
// PodScheduled) are left untouched, and the patch needs no resourceVersion
// and never conflicts with them. The patch also carries metadata.uid as a
// precondition (as the kubelet's status manager does), so a status meant
// for a deleted pod never lands on a new pod of the same name (the API
// server answers such a patch with 422 "metadata.uid: field is
// immutable"; the status is then dropped, not retried).
//
// Why a strategic merge patch rather than server-side apply: both merge
// status.conditions by type, so neither touches other writers' conditions;
// the patch is what the kubelet's status manager sends, states the UID
// precondition directly, and needs no apply configuration that must list
// every owned field on each write.
//
// A condition changed behind the writer's back (after it was written) is
// corrected at the pod's next change the caller reports with Recheck (the
// informer's event of the overwrite itself), or at the pod's next status
// change. Callers Forget a pod when it is deleted.
type PodConditions struct {
	client    kubernetes.Interface
	cachedPod func(namespace, name string) *corev1.Pod
	clock     clock.PassiveClock
	queue     workqueue.TypedRateLimitingInterface[string]
	gate      Gate
	// pendingDelay is PodConditionsConfig.PendingDelay, defaulted.
	pendingDelay time.Duration

	// mu guards desired and written, both keyed by pod UID.
	mu sync.Mutex
	// desired is the latest status Set for each pod not Forgotten.
	desired map[types.UID]PodVolumesStatus
	// written is the condition last written to (or found on) each pod.
	written map[types.UID]corev1.PodCondition
}

// NewPodConditions returns a writer; call Run to start writing.
func NewPodConditions(cfg PodConditionsConfig) (*PodConditions, error) {
	if cfg.Client == nil {
		return nil, errors.New("status: PodConditionsConfig.Client is required")
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	pendingDelay := cfg.PendingDelay
	switch {
	case pendingDelay == 0:
		pendingDelay = DefaultPendingDelay
	case pendingDelay < 0:
		pendingDelay = 0
	}
	return &PodConditions{
		pendingDelay: pendingDelay,
		client:       cfg.Client,
		cachedPod:    cfg.CachedPod,
		clock:        clk,
		queue:        newQueue(PodConditionsQueueName, cfg.Queue),
		gate:         cfg.Gate,
		desired:      map[types.UID]PodVolumesStatus{},
		written:      map[types.UID]corev1.PodCondition{},
	}, nil
}

// Set records s as the status wanted on s.Pod and schedules the write: at
// once, or after the PendingDelay for a Pending status. The message is
// cleaned and truncated (see PodVolumesStatus). Setting the status that is
// already wanted does nothing.
func (w *PodConditions) Set(s PodVolumesStatus) {
	if s.Ready {
		// A ready pod's condition has no reason, or says what to watch
		// (ReasonVolumeUnhealthy).
		s.Pending = false
		if s.Reason != ReasonVolumeUnhealthy {
			s.Reason, s.Message = "", ""
		}
	}
	s.Message = sanitizeMessage(s.Message)
	s.Reason = truncate(s.Reason, maxReasonLength)
	uid := s.Pod.UID
	w.mu.Lock()
	if prev, ok := w.desired[uid]; ok && prev == s {
		w.mu.Unlock()
		return
	}
	w.desired[uid] = s
	w.mu.Unlock()
	if s.Pending && w.pendingDelay > 0 {
		// Whatever is wanted when the delay ends is written then.
		w.queue.AddAfter(string(uid), w.pendingDelay)
		return
	}
	w.queue.Add(string(uid))
}

// maxReasonLength is the API limit of an Event reason, also used for the
// condition reason.
const maxReasonLength = 128

// Forget drops everything known about the pod: call it when the pod is
// deleted. A write in flight completes; nothing more is written.
func (w *PodConditions) Forget(uid types.UID) {
	w.mu.Lock()
	delete(w.desired, uid)
	delete(w.written, uid)
	w.mu.Unlock()
	w.queue.Forget(string(uid))
}

// Run writes conditions with workers goroutines until ctx is done.
func (w *PodConditions) Run(ctx context.Context, workers int) {
	logger := klog.FromContext(ctx).WithName("pod-conditions")
	ctx = klog.NewContext(ctx, logger)
	logger.V(2).Info("Starting pod condition writer", "workers", workers)
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() { runWorker(ctx, w.queue, w.gate, w.sync) })
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
	logger.V(2).Info("Stopped pod condition writer")
}

// sync writes the desired condition of the pod with UID key, if needed.
func (w *PodConditions) sync(ctx context.Context, key string) error {
	uid := types.UID(key)
	w.mu.Lock()
	want, ok := w.desired[uid]
	current, haveWritten := w.written[uid]
	w.mu.Unlock()
	if !ok {
		return nil // forgotten
	}
	logger := klog.FromContext(ctx)
	if want.Pod.Namespace == "" || want.Pod.Name == "" || uid == "" {
		logger.Error(nil, "Dropping pod condition without pod namespace, name or UID",
			"pod", klog.KRef(want.Pod.Namespace, want.Pod.Name), "podUID", uid)
		w.dropIfStill(uid, want)
		return nil
	}
	var cur *corev1.PodCondition
	if haveWritten {
		cur = &current
	} else {
		cur = w.cachedCondition(want.Pod)
	}
	if cur != nil && sameCondition(cur, want) {
		if !haveWritten {
			w.recordWritten(uid, *cur)
		}
		return nil
	}

	cond := corev1.PodCondition{
		Type:               ConditionVolumesReady,
		Status:             conditionStatus(want.Ready),
		Reason:             want.Reason,
		Message:            want.Message,
		LastTransitionTime: metav1.NewTime(w.clock.Now()),
	}
	if cur != nil && cur.Status == cond.Status {
		cond.LastTransitionTime = cur.LastTransitionTime
	}
	written, err := w.patch(ctx, want.Pod, cond)
	pod := klog.KRef(want.Pod.Namespace, want.Pod.Name)
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || isUIDMismatch(err):
		// The pod is gone, or its name now belongs to a pod with another UID
		// (the UID precondition failed): nothing to write any more.
		logger.V(4).Info("Pod gone, dropping its condition", "pod", pod, "podUID", uid, "err", err)
		w.dropIfStill(uid, want)
		return nil
	case apierrors.IsInvalid(err):
		// The same patch would be rejected again: no retry.
		logger.Error(err, "API server rejected the pod condition, dropping it", "pod", pod, "podUID", uid)
		w.dropIfStill(uid, want)
		return nil
	case err != nil:
		return fmt.Errorf("writing condition %s on pod %s/%s: %w", ConditionVolumesReady,
			want.Pod.Namespace, want.Pod.Name, err)
	}
	logger.V(4).Info("Wrote pod condition", "pod", pod, "status", cond.Status, "reason", cond.Reason)
	w.recordWritten(uid, written)
	return nil
}

// cachedCondition returns the condition on the cached pod, if the cache
// holds this pod (same UID) and the pod has the condition.
func (w *PodConditions) cachedCondition(p volume.PodInfo) *corev1.PodCondition {
	if w.cachedPod == nil {
		return nil
	}
	pod := w.cachedPod(p.Namespace, p.Name)
	if pod == nil || pod.UID != p.UID {
		return nil
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == ConditionVolumesReady {
			c := pod.Status.Conditions[i]
			return &c
		}
	}
	return nil
}

// recordWritten remembers c as the pod's condition, unless the pod was
// forgotten meanwhile.
func (w *PodConditions) recordWritten(uid types.UID, c corev1.PodCondition) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.desired[uid]; ok {
		w.written[uid] = c
	}
}

// dropIfStill forgets a pod that turned out to be gone, unless a new status
// was Set meanwhile (then that one is tried).
func (w *PodConditions) dropIfStill(uid types.UID, want PodVolumesStatus) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.desired[uid] == want {
		delete(w.desired, uid)
		delete(w.written, uid)
	}
}

// patch writes cond on the pod's status and returns the condition as the
// API server stored it.
func (w *PodConditions) patch(ctx context.Context, p volume.PodInfo, cond corev1.PodCondition) (corev1.PodCondition, error) {
	data, err := conditionPatch(p.UID, cond)
	if err != nil {
		return cond, err
	}
	pod, err := w.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, data,
		metav1.PatchOptions{}, "status")
	if err != nil {
		return cond, err
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == cond.Type {
			return c, nil
		}
	}
	return cond, nil
}

// conditionPatch is the strategic merge patch that sets cond, and only
// cond, in status.conditions of the pod with UID uid. Empty reason and
// message are sent as null, so the merge deletes a previous reason instead
// of keeping it; lastProbeTime is not used.
func conditionPatch(uid types.UID, cond corev1.PodCondition) ([]byte, error) {
	nullIfEmpty := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	patch := map[string]any{
		"metadata": map[string]any{"uid": uid},
		"status": map[string]any{
			"conditions": []map[string]any{{
				"type":               cond.Type,
				"status":             cond.Status,
				"reason":             nullIfEmpty(cond.Reason),
				"message":            nullIfEmpty(cond.Message),
				"lastTransitionTime": cond.LastTransitionTime,
			}},
		},
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encoding pod condition patch: %w", err)
	}
	return data, nil
}

// isUIDMismatch says whether err is the API server's answer to a patch
// whose metadata.uid differs from the pod's: 422 Invalid, "metadata.uid:
// field is immutable". That is how the UID precondition fails.
func isUIDMismatch(err error) bool {
	statusErr, ok := errors.AsType[*apierrors.StatusError](err)
	if !ok || !apierrors.IsInvalid(err) || statusErr.ErrStatus.Details == nil {
		return false
	}
	for _, cause := range statusErr.ErrStatus.Details.Causes {
		if cause.Field == "metadata.uid" {
			return true
		}
	}
	return false
}

// sameCondition says whether c already says what s wants.
func sameCondition(c *corev1.PodCondition, s PodVolumesStatus) bool {
	return c.Status == conditionStatus(s.Ready) && c.Reason == s.Reason && c.Message == s.Message
}

func conditionStatus(ready bool) corev1.ConditionStatus {
	if ready {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}
