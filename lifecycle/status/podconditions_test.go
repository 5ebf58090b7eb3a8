package status_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func testPod(name string, conds ...corev1.PodCondition) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Status:     corev1.PodStatus{Conditions: conds},
	}
}

func podInfo(pod *corev1.Pod) volume.PodInfo {
	return volume.PodInfo{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}
}

type condFixture struct {
	client  *fake.Clientset
	clock   *testingclock.FakePassiveClock
	writer  *status.PodConditions
	limiter *countingLimiter
	ctx     context.Context
}

// startConditions starts a writer (one worker) over a fake clientset
// holding pods. cached, if set, is the writer's informer cache.
func startConditions(t *testing.T, cached func(ns, name string) *corev1.Pod, pods ...*corev1.Pod) *condFixture {
	t.Helper()
	objs := make([]runtime.Object, 0, len(pods))
	for _, p := range pods {
		objs = append(objs, p)
	}
	f := &condFixture{
		client:  fake.NewClientset(objs...),
		clock:   testingclock.NewFakePassiveClock(t0),
		limiter: newCountingLimiter(),
		ctx:     testContext(t),
	}
	w, err := status.NewPodConditions(status.PodConditionsConfig{
		Client: f.client, CachedPod: cached, Clock: f.clock,
		Queue: status.QueueOptions{RateLimiter: f.limiter},
	})
	if err != nil {
		t.Fatalf("NewPodConditions() error: %v", err)
	}
	f.writer = w
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(f.ctx)
	go func() { defer close(done); w.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *condFixture) get(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod, err := f.client.CoreV1().Pods("ns").Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting pod %s: %v", name, err)
	}
	return pod
}

// waitCondition waits until the pod's condition has the wanted status,
// reason and message, and returns the pod.
func (f *condFixture) waitCondition(t *testing.T, name string, want status.PodVolumesStatus) *corev1.Pod {
	t.Helper()
	wantStatus := corev1.ConditionFalse
	if want.Ready {
		wantStatus = corev1.ConditionTrue
	}
	var pod *corev1.Pod
	waitFor(f.ctx, t, "condition on pod "+name, func() (bool, error) {
		pod = f.get(t, name)
		c := podCondition(pod)
		return c != nil && c.Status == wantStatus && c.Reason == want.Reason && c.Message == want.Message, nil
	})
	return pod
}

func blocked(pod *corev1.Pod, reason, message string) status.PodVolumesStatus {
	return status.PodVolumesStatus{Pod: podInfo(pod), Reason: reason, Message: message}
}

// TestConditionTransitions walks a pod from blocked to blocked-otherwise
// to ready and checks every field, lastTransitionTime above all, and that
// the kubelet's conditions are never touched.
func TestConditionTransitions(t *testing.T) {
	pod := testPod("p1", kubeletConditions(t0.Add(-time.Hour))...)
	f := startConditions(t, nil, pod)
	others := kubeletConditions(t0.Add(-time.Hour))

	// 1. Blocked: False, lastTransitionTime now.
	first := blocked(pod, status.ReasonWaitingForAttach, "volume pvc-1: waiting for attach")
	f.writer.Set(first)
	got := f.waitCondition(t, "p1", first)
	c := podCondition(got)
	if !c.LastTransitionTime.Equal(&metav1.Time{Time: t0}) {
		t.Errorf("lastTransitionTime = %v, want %v", c.LastTransitionTime, t0)
	}
	if !c.LastProbeTime.IsZero() {
		t.Errorf("lastProbeTime = %v, want unset", c.LastProbeTime)
	}
	if o := otherConditions(got); !equality.Semantic.DeepEqual(o, others) {
		t.Errorf("other conditions changed:\n got %s\nwant %s", mustJSON(o), mustJSON(others))
	}

	// 2. Still False, another reason: lastTransitionTime kept.
	f.clock.SetTime(t0.Add(time.Minute))
	second := blocked(pod, status.ReasonNodeStageFailed, "volume pvc-1: NodeStageVolume failed: boom")
	f.writer.Set(second)
	c = podCondition(f.waitCondition(t, "p1", second))
	if !c.LastTransitionTime.Equal(&metav1.Time{Time: t0}) {
		t.Errorf("after a reason change, lastTransitionTime = %v, want it kept at %v", c.LastTransitionTime, t0)
	}

	// 3. Ready: True, no reason or message left over, lastTransitionTime now.
	t2 := t0.Add(2 * time.Minute)
	f.clock.SetTime(t2)
	f.writer.Set(status.Ready(podInfo(pod)))
	got = f.waitCondition(t, "p1", status.Ready(podInfo(pod)))
	c = podCondition(got)
	if !c.LastTransitionTime.Equal(&metav1.Time{Time: t2}) {
		t.Errorf("after False→True, lastTransitionTime = %v, want %v", c.LastTransitionTime, t2)
	}
	if n := len(got.Status.Conditions); n != 3 {
		t.Errorf("pod has %d conditions, want 3: %s", n, mustJSON(got.Status.Conditions))
	}
	if o := otherConditions(got); !equality.Semantic.DeepEqual(o, others) {
		t.Errorf("other conditions changed:\n got %s\nwant %s", mustJSON(o), mustJSON(others))
	}
	if n := len(patches(f.client, "pods")); n != 3 {
		t.Errorf("%d patches, want 3", n)
	}
}

// TestConditionNoWriteWhenUnchanged sets the same status repeatedly: only
// the first is written. A later change is the sync point: with one worker,
// any write of the repeats would have come before it.
func TestConditionNoWriteWhenUnchanged(t *testing.T) {
	pod := testPod("p1")
	f := startConditions(t, nil, pod)

	s := blocked(pod, status.ReasonDriverNotRegistered, "volume pvc-1: CSI driver is not registered")
	f.writer.Set(s)
	f.waitCondition(t, "p1", s)
	for range 5 {
		f.writer.Set(s)
	}
	// A message that differs only by whitespace and control characters
	// sanitizes to the same status: no write either.
	f.writer.Set(blocked(pod, s.Reason, "volume  pvc-1:\n CSI driver is not registered\n"))
	f.writer.Set(status.Ready(podInfo(pod)))
	f.waitCondition(t, "p1", status.Ready(podInfo(pod)))

	if got := patches(f.client, "pods"); len(got) != 2 {
		t.Errorf("%d patches, want 2 (blocked, ready):\n%s", len(got), strings.Join(got, "\n"))
	}
}

// TestConditionFromCacheAfterRestart: the informer cache shows the
// condition a previous run wrote. The same status is not written again,
// and a new reason with the same status keeps the old lastTransitionTime.
func TestConditionFromCacheAfterRestart(t *testing.T) {
	old := metav1.NewTime(t0.Add(-24 * time.Hour))
	existing := corev1.PodCondition{Type: status.ConditionVolumesReady, Status: corev1.ConditionFalse,
		Reason: status.ReasonWaitingForAttach, Message: "volume pvc-1: waiting", LastTransitionTime: old}
	pod := testPod("p1", existing)
	f := startConditions(t, func(ns, name string) *corev1.Pod {
		if ns == pod.Namespace && name == pod.Name {
			return pod
		}
		return nil
	}, pod)

	f.writer.Set(blocked(pod, existing.Reason, existing.Message))
	next := blocked(pod, status.ReasonNodeStageFailed, "volume pvc-1: NodeStageVolume failed: x")
	f.writer.Set(next)
	c := podCondition(f.waitCondition(t, "p1", next))
	if !c.LastTransitionTime.Equal(&old) {
		t.Errorf("lastTransitionTime = %v, want the cached %v", c.LastTransitionTime, old)
	}
	if got := patches(f.client, "pods"); len(got) != 1 {
		t.Errorf("%d patches, want 1 (the unchanged cached status is not rewritten):\n%s", len(got), strings.Join(got, "\n"))
	}
}

// TestConditionCacheOfAnotherPodIgnored: a cached pod with the same name
// but another UID (a re-created pod) says nothing about this pod.
func TestConditionCacheOfAnotherPodIgnored(t *testing.T) {
	pod := testPod("p1")
	stale := testPod("p1", corev1.PodCondition{Type: status.ConditionVolumesReady, Status: corev1.ConditionTrue})
	stale.UID = "uid-old"
	f := startConditions(t, func(string, string) *corev1.Pod { return stale }, pod)

	f.writer.Set(status.Ready(podInfo(pod)))
	f.waitCondition(t, "p1", status.Ready(podInfo(pod)))
	if got := patches(f.client, "pods"); len(got) != 1 {
		t.Errorf("%d patches, want 1", len(got))
	}
}

// TestConditionLatestWins changes the status twice while a write is in
// flight: the intermediate status is never written, the latest is.
func TestConditionLatestWins(t *testing.T) {
	pod := testPod("p1")
	f := startConditions(t, nil, pod)
	g := newGate(f.client, "pods")

	a := blocked(pod, status.ReasonWaitingForAttach, "a")
	f.writer.Set(a)
	<-g.entered
	f.writer.Set(blocked(pod, status.ReasonNodeStageFailed, "b"))
	c := blocked(pod, status.ReasonNodePublishFailed, "c")
	f.writer.Set(c)
	close(g.release)
	f.waitCondition(t, "p1", c)

	got := patches(f.client, "pods")
	if len(got) != 2 || !strings.Contains(got[0], `"message":"a"`) || !strings.Contains(got[1], `"message":"c"`) {
		t.Errorf("patches = %v, want two: a then c", got)
	}
}

// TestConditionRetriesFailedWrites fails the first two writes; the writer
// retries through the rate limiter and succeeds.
func TestConditionRetriesFailedWrites(t *testing.T) {
	pod := testPod("p1")
	f := startConditions(t, nil, pod)
	failures := 2
	f.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failures > 0 { // the one worker is the only caller
			failures--
			return true, nil, apierrors.NewInternalError(errors.New("etcd is down"))
		}
		return false, nil, nil
	})

	s := status.Ready(podInfo(pod))
	f.writer.Set(s)
	f.waitCondition(t, "p1", s)
	if n := f.limiter.NumRequeues(string(pod.UID)); n != 2 {
		t.Errorf("%d retries, want 2", n)
	}
}

// TestConditionPodGone: the pod is gone (NotFound), or its name belongs to
// a new pod (the UID precondition fails), or the API server rejects the
// write as invalid. None is retried.
func TestConditionPodGone(t *testing.T) {
	for name, apiErr := range map[string]error{
		"not found": apierrors.NewNotFound(corev1.Resource("pods"), "p1"),
		"conflict":  apierrors.NewConflict(corev1.Resource("pods"), "p1", errors.New("UID precondition")),
		// What a real API server answers when the UID precondition fails.
		"uid mismatch": apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), "p1",
			field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), "uid-p1", "field is immutable")}),
		// Any other rejection: the same patch would be rejected again.
		"invalid": apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), "p1",
			field.ErrorList{field.Invalid(field.NewPath("status", "conditions"), "x", "bad")}),
	} {
		t.Run(name, func(t *testing.T) {
			gone, other := testPod("p1"), testPod("p2")
			f := startConditions(t, nil, gone, other)
			f.client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.(k8stesting.PatchAction).GetName() == "p1" {
					return true, nil, apiErr
				}
				return false, nil, nil
			})

			f.writer.Set(status.Ready(podInfo(gone)))
			f.writer.Set(status.Ready(podInfo(other)))
			// One worker: p1 was handled completely before p2 was written.
			f.waitCondition(t, "p2", status.Ready(podInfo(other)))
			if n := f.limiter.NumRequeues(string(gone.UID)); n != 0 {
				t.Errorf("write to a gone pod retried %d times, want 0", n)
			}
			if got := patches(f.client, "pods"); len(got) != 2 {
				t.Errorf("%d patches, want 2", len(got))
			}
		})
	}
}

// TestConditionForget: a pod forgotten before its write is never written.
func TestConditionForget(t *testing.T) {
	p1, p2 := testPod("p1"), testPod("p2")
	f := startConditions(t, nil, p1, p2)
	g := newGate(f.client, "pods")

	f.writer.Set(status.Ready(podInfo(p2)))
	<-g.entered // the worker is busy with p2
	f.writer.Set(status.Ready(podInfo(p1)))
	f.writer.Forget(p1.UID)
	f.writer.Set(blocked(p2, "X", "y"))
	close(g.release)
	f.waitCondition(t, "p2", blocked(p2, "X", "y"))
	if c := podCondition(f.get(t, "p1")); c != nil {
		t.Errorf("forgotten pod p1 has condition %+v, want none", c)
	}
}

// TestConditionMessageTruncated: a driver's huge multi-line message is
// cut to MaxMessageLength on one line.
func TestConditionMessageTruncated(t *testing.T) {
	pod := testPod("p1")
	f := startConditions(t, nil, pod)
	var huge strings.Builder
	for i := range 500 {
		fmt.Fprintf(&huge, "line %d of the driver's dump\n", i)
	}
	f.writer.Set(blocked(pod, status.ReasonNodeStageFailed, huge.String()))
	var c *corev1.PodCondition
	waitFor(f.ctx, t, "condition", func() (bool, error) {
		c = podCondition(f.get(t, "p1"))
		return c != nil, nil
	})
	if len(c.Message) > status.MaxMessageLength || !strings.HasSuffix(c.Message, "…") ||
		!strings.HasPrefix(c.Message, "line 0 of the driver's dump line 1 of") || strings.Contains(c.Message, "\n") {
		t.Errorf("message (%d bytes) = %q, want ≤ %d bytes on one line, ending in …",
			len(c.Message), c.Message, status.MaxMessageLength)
	}
}

func TestNewPodConditionsNeedsClient(t *testing.T) {
	if _, err := status.NewPodConditions(status.PodConditionsConfig{}); err == nil {
		t.Error("NewPodConditions() without Client succeeded, want an error")
	}
}

// TestPendingStatusHeldBack: a status that only says a step is in progress
// is written after the PendingDelay, unless a newer status replaced it by
// then; failures and Ready are written at once. With one worker, a status
// written at once for q is the sync point: a pending status of p written
// at once would have come before it.
func TestPendingStatusHeldBack(t *testing.T) {
	p, q := testPod("p"), testPod("q")
	queueClock := testingclock.NewFakeClock(t0)
	f := &condFixture{client: fake.NewClientset(p, q), clock: testingclock.NewFakePassiveClock(t0), ctx: testContext(t)}
	w, err := status.NewPodConditions(status.PodConditionsConfig{
		Client: f.client, Clock: f.clock, PendingDelay: time.Second,
		Queue: status.QueueOptions{Clock: queueClock},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.writer = w
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })

	pending := status.Blocked(podInfo(p), status.Blocker{SpecName: "data", Step: volume.StepStage})
	if !pending.Pending || pending.Reason != status.ReasonVolumesPending {
		t.Fatalf("Blocked without an error = %+v, want a Pending VolumesPending status", pending)
	}
	w.Set(pending)
	failed := status.Blocked(podInfo(q), status.Blocker{SpecName: "data", Step: volume.StepStage, Err: errors.New("boom")})
	if failed.Pending {
		t.Fatalf("Blocked with an error is Pending: %+v", failed)
	}
	w.Set(failed)
	f.waitCondition(t, "q", failed)
	if c := podCondition(f.get(t, "p")); c != nil {
		t.Fatalf("pending status written before its delay: %+v", c)
	}

	// The delay passes with p still pending: written then.
	queueClock.Step(time.Second)
	f.waitCondition(t, "p", pending)

	// Pending then Ready within the delay: only Ready is written.
	before := len(patches(f.client, "pods"))
	w.Set(status.Blocked(podInfo(q), status.Blocker{SpecName: "data", Step: volume.StepPublish}))
	w.Set(status.Ready(podInfo(q)))
	f.waitCondition(t, "q", status.Ready(podInfo(q)))
	queueClock.Step(time.Second)
	w.Set(failed) // sync point after the delayed key was processed
	f.waitCondition(t, "q", failed)
	if got := patches(f.client, "pods")[before:]; len(got) != 2 {
		t.Errorf("%d patches after pending → ready → failed, want 2 (ready, failed):\n%s", len(got), strings.Join(got, "\n"))
	}
}
