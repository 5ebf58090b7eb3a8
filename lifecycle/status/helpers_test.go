package status_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
)

// waitTimeout bounds every wait for an asynchronous write.
const waitTimeout = 30 * time.Second

// testContext returns a context with a per-test logger, canceled when the
// test ends.
func testContext(t *testing.T) context.Context {
	t.Helper()
	return klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig()))
}

// waitFor polls cond until it returns true, failing t after waitTimeout.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, waitTimeout, true,
		func(context.Context) (bool, error) { return cond() })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// patches returns the bodies of the patch actions on resource recorded by
// client, in order.
func patches(client *fake.Clientset, resource string) []string {
	var out []string
	for _, a := range client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == resource {
			out = append(out, string(p.GetPatch()))
		}
	}
	return out
}

// gate is a patch reactor that holds the first patch of a resource until
// released, so a test can change the desired state while a write is in
// flight.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate(client *fake.Clientset, resource string) *gate {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	client.PrependReactor("patch", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		first := false
		g.once.Do(func() { first = true })
		if first {
			close(g.entered)
			<-g.release
		}
		return false, nil, nil // let the object tracker apply the patch
	})
	return g
}

// countingLimiter is a fast rate limiter that counts the retries per key.
type countingLimiter struct {
	mu    sync.Mutex
	whens map[string]int
}

var _ workqueue.TypedRateLimiter[string] = &countingLimiter{}

func newCountingLimiter() *countingLimiter { return &countingLimiter{whens: map[string]int{}} }

func (c *countingLimiter) When(key string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.whens[key]++
	return time.Millisecond
}
func (c *countingLimiter) Forget(string) {}
func (c *countingLimiter) NumRequeues(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.whens[key]
}

// podCondition returns the pod's VolumesReady condition, or nil.
func podCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == status.ConditionVolumesReady {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// otherConditions returns the pod's conditions other than VolumesReady, in
// order. (A strategic merge patch may put a new condition first; the order
// of conditions carries no meaning.)
func otherConditions(pod *corev1.Pod) []corev1.PodCondition {
	var out []corev1.PodCondition
	for _, c := range pod.Status.Conditions {
		if c.Type != status.ConditionVolumesReady {
			out = append(out, c)
		}
	}
	return out
}

// kubeletConditions are conditions another writer (a kubelet, a
// scheduler) owns; the writer must never change them.
func kubeletConditions(at time.Time) []corev1.PodCondition {
	ts := metav1.NewTime(at.Truncate(time.Second))
	return []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: ts},
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady",
			Message: "containers with unready status: [app]", LastTransitionTime: ts},
	}
}

// mustJSON renders v for failure messages.
func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
