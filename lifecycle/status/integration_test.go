package status_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) {
	k8stest.Main(m, k8stest.Options{})
}

// createPod creates a pod on nodeName and gives it the conditions a
// kubelet would have written.
func createPod(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name, nodeName string) *corev1.Pod {
	t.Helper()
	pod, err := client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:   nodeName,
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	pod.Status.Conditions = kubeletConditions(t0)
	pod, err = client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("writing the kubelet's pod conditions: %v", err)
	}
	return pod
}

// runConditions starts a writer against the real API server.
func runConditions(ctx context.Context, t *testing.T, client kubernetes.Interface, limiter *countingLimiter,
	workers int) *status.PodConditions {
	t.Helper()
	w, err := status.NewPodConditions(status.PodConditionsConfig{
		Client: client, Queue: status.QueueOptions{RateLimiter: limiter},
	})
	if err != nil {
		t.Fatalf("NewPodConditions() error: %v", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, workers) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// waitPodCondition waits until the real pod's condition matches want.
func waitPodCondition(ctx context.Context, t *testing.T, client kubernetes.Interface, pod *corev1.Pod,
	want status.PodVolumesStatus) *corev1.Pod {
	t.Helper()
	wantStatus := corev1.ConditionFalse
	if want.Ready {
		wantStatus = corev1.ConditionTrue
	}
	var got *corev1.Pod
	waitFor(ctx, t, "condition on pod "+pod.Name, func() (bool, error) {
		var err error
		got, err = client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := podCondition(got)
		return c != nil && c.Status == wantStatus && c.Reason == want.Reason && c.Message == want.Message, nil
	})
	return got
}

// TestPodConditionOnRealPod writes the condition on a real pod: blocked,
// then ready. The fields are right, the reason and message go away when
// ready, and the kubelet's conditions are kept.
func TestPodConditionOnRealPod(t *testing.T) {
	f := k8stest.New(t)
	ctx := testContext(t)
	pod := createPod(ctx, t, f.Client, f.Namespace, "web", f.NodeName)
	w := runConditions(ctx, t, f.Client, newCountingLimiter(), 2)

	b := status.Blocker{Step: volume.StepWaitForAttach, SpecName: "data",
		Source: volume.Source{ID: volume.ID{Driver: "hostpath.csi.k8s.io", Handle: "vol-1", PVName: "pvc-1"}},
		Err:    errors.New("waiting for VolumeAttachment csi-0123 to be attached")}
	blockedStatus := status.Blocked(podInfo(pod), b)
	w.Set(blockedStatus)
	got := waitPodCondition(ctx, t, f.Client, pod, blockedStatus)
	c := podCondition(got)
	if c.Reason != status.ReasonAttachFailed || c.LastTransitionTime.IsZero() ||
		c.Message != "volume pvc-1 (driver hostpath.csi.k8s.io, handle vol-1): waiting for VolumeAttachment csi-0123 to be attached" {
		t.Errorf("condition = %s", mustJSON(c))
	}
	if o := otherConditions(got); !equality.Semantic.DeepEqual(o, kubeletConditions(t0)) {
		t.Errorf("kubelet's conditions changed: %s", mustJSON(o))
	}

	w.Set(status.Ready(podInfo(pod)))
	got = waitPodCondition(ctx, t, f.Client, pod, status.Ready(podInfo(pod)))
	if c := podCondition(got); c.Reason != "" || c.Message != "" || c.LastTransitionTime.IsZero() {
		t.Errorf("ready condition = %s, want True without reason or message", mustJSON(c))
	}
	if o := otherConditions(got); !equality.Semantic.DeepEqual(o, kubeletConditions(t0)) {
		t.Errorf("kubelet's conditions changed: %s", mustJSON(o))
	}
}

// TestPodConditionNotOnRecreatedPod: a status meant for a deleted pod is
// not written on a new pod of the same name (the UID precondition), and is
// not retried.
func TestPodConditionNotOnRecreatedPod(t *testing.T) {
	f := k8stest.New(t)
	ctx := testContext(t)
	old := createPod(ctx, t, f.Client, f.Namespace, "web", f.NodeName)
	zero := int64(0)
	if err := f.Client.CoreV1().Pods(f.Namespace).Delete(ctx, old.Name,
		metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("deleting pod: %v", err)
	}
	waitFor(ctx, t, "pod deletion", func() (bool, error) {
		p, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, old.Name, metav1.GetOptions{})
		return err != nil || p.UID != old.UID, nil
	})
	recreated := createPod(ctx, t, f.Client, f.Namespace, "web", f.NodeName)
	witness := createPod(ctx, t, f.Client, f.Namespace, "witness", f.NodeName)
	limiter := newCountingLimiter()
	w := runConditions(ctx, t, f.Client, limiter, 1)

	w.Set(status.Ready(podInfo(old)))
	w.Set(status.Ready(podInfo(witness)))
	// One worker: once the witness is written, the old pod's write has been
	// answered and either dropped or scheduled for a retry.
	waitPodCondition(ctx, t, f.Client, witness, status.Ready(podInfo(witness)))
	if n := limiter.NumRequeues(string(old.UID)); n != 0 {
		t.Errorf("write for the deleted pod retried %d times, want 0", n)
	}
	got, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, recreated.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting the recreated pod: %v", err)
	}
	if got.UID == old.UID {
		t.Fatal("recreated pod has the old UID")
	}
	if c := podCondition(got); c != nil {
		t.Errorf("recreated pod got the old pod's condition %s", mustJSON(c))
	}
}

// TestVolumesInUseOnRealNode writes volumesInUse on a real Node whose
// volumesAttached the attach/detach controller has set, and checks that
// volumesAttached survives every write.
func TestVolumesInUseOnRealNode(t *testing.T) {
	f := k8stest.New(t)
	ctx := testContext(t)
	node := f.CreateNode(t)
	node.Status.VolumesAttached = []corev1.AttachedVolume{{Name: corev1.UniqueVolumeName(volA), DevicePath: "/dev/xvdf"}}
	if _, err := f.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("writing volumesAttached: %v", err)
	}
	w, err := status.NewVolumesInUse(status.VolumesInUseConfig{Client: f.Client, NodeName: f.NodeName})
	if err != nil {
		t.Fatalf("NewVolumesInUse() error: %v", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(runCtx, nil) }()
	t.Cleanup(func() { cancel(); <-done })

	check := func(want ...corev1.UniqueVolumeName) {
		t.Helper()
		var got *corev1.Node
		waitFor(ctx, t, "volumesInUse", func() (bool, error) {
			var err error
			got, err = f.Client.CoreV1().Nodes().Get(ctx, f.NodeName, metav1.GetOptions{})
			return err == nil && slices.Equal(got.Status.VolumesInUse, want), err
		})
		if len(got.Status.VolumesAttached) != 1 || got.Status.VolumesAttached[0].Name != corev1.UniqueVolumeName(volA) ||
			got.Status.VolumesAttached[0].DevicePath != "/dev/xvdf" {
			t.Errorf("volumesAttached = %v, want it kept", got.Status.VolumesAttached)
		}
	}
	w.Set([]volume.Name{volB, volA})
	check(corev1.UniqueVolumeName(volA), corev1.UniqueVolumeName(volB))
	waitFor(ctx, t, "Reported", func() (bool, error) { return w.Reported(volA) && w.Reported(volB), nil })
	w.Set(nil)
	check()
}

// TestEventsOnRealAPIServer records a FailedMount on a real pod and an
// Event on the Node, and finds them where kubectl describe looks.
func TestEventsOnRealAPIServer(t *testing.T) {
	f := k8stest.New(t)
	ctx := testContext(t)
	pod := createPod(ctx, t, f.Client, f.Namespace, "web", f.NodeName)
	e, err := status.NewEvents(ctx, status.EventsConfig{Client: f.Client, NodeName: f.NodeName})
	if err != nil {
		t.Fatalf("NewEvents() error: %v", err)
	}
	t.Cleanup(e.Shutdown)

	e.VolumeFailed(podInfo(pod), status.Blocker{Step: volume.StepPublish, SpecName: "data",
		Source: volume.Source{ID: volume.ID{Driver: "d", Handle: "h", PVName: "pvc-1"}}, Err: errors.New("target busy")})
	e.Node(corev1.EventTypeWarning, status.EventDriverRegistrationFailed, "driver rejected")

	find := func(ns string, kind, name string, uid types.UID) corev1.Event {
		t.Helper()
		selector := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name,
			"involvedObject.uid": string(uid)}.AsSelector().String()
		var ev corev1.Event
		waitFor(ctx, t, kind+" Event", func() (bool, error) {
			list, err := f.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: selector})
			if err != nil || len(list.Items) == 0 {
				return false, err
			}
			ev = list.Items[0]
			return true, nil
		})
		return ev
	}
	podEv := find(f.Namespace, "Pod", pod.Name, pod.UID)
	if podEv.Reason != status.EventFailedMount || podEv.Type != corev1.EventTypeWarning ||
		podEv.Message != `MountVolume.SetUp failed for volume "pvc-1" : target busy` ||
		podEv.Source.Component != status.Component || podEv.Source.Host != f.NodeName {
		t.Errorf("pod Event = %s", mustJSON(podEv))
	}
	nodeEv := find(metav1.NamespaceDefault, "Node", f.NodeName, types.UID(f.NodeName))
	if nodeEv.Reason != status.EventDriverRegistrationFailed || nodeEv.Message != "driver rejected" {
		t.Errorf("Node Event = %s", mustJSON(nodeEv))
	}
}
