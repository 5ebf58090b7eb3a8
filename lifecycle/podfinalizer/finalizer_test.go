package podfinalizer_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/podfinalizer"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

const waitTimeout = 30 * time.Second

// env is a Finalizer over a real API server, the real node-scoped pod
// source and the real state stores.
type env struct {
	f       *k8stest.Fixture
	ctx     context.Context
	logs    ktesting.Underlier
	desired *dsw.Store
	actual  *asw.World
	layout  paths.Layout
	fin     *podfinalizer.Finalizer
}

// newEnv runs a Finalizer for f's node; pods nil means the real source.
func newEnv(t *testing.T, f *k8stest.Fixture, pods podfinalizer.Pods) *env {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(4)))
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
	layout, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{f: f, ctx: ctx, logs: logger.GetSink().(ktesting.Underlier), desired: dsw.New(), actual: asw.New(asw.Options{}), layout: layout}
	var src *source.Source
	if pods == nil {
		src, err = source.New(ctx, source.Config{Client: f.Client, NodeName: f.NodeName})
		if err != nil {
			t.Fatal(err)
		}
		pods = src
	}
	e.fin, err = podfinalizer.New(podfinalizer.Config{
		Client: f.Client, Pods: pods, Desired: e.desired, Actual: e.actual, Layout: layout,
		RetryBaseDelay: 20 * time.Millisecond, RetryMaxDelay: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		if src != nil {
			go src.Run(ctx)
		}
		e.fin.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// createPod creates a pod bound to the node; deleting it only marks it for
// deletion (graceful deletion of a bound pod), as in a cluster.
func (e *env) createPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.f.Namespace},
		Spec:       corev1.PodSpec{NodeName: e.f.NodeName, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}
	created, err := e.f.Client.CoreV1().Pods(e.f.Namespace).Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

func (e *env) markForDeletion(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := e.f.Client.CoreV1().Pods(pod.Namespace).Delete(e.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) podGone(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.f.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s was not deleted: %v", pod.Name, err)
	}
}

func (e *env) waitForLog(t *testing.T, what string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
		return strings.Contains(e.logs.GetBuffer().String(), what), nil
	})
	if err != nil {
		t.Fatalf("waiting for the log %q: %v", what, err)
	}
}

func (e *env) stillThere(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	got, err := e.f.Client.CoreV1().Pods(pod.Namespace).Get(e.ctx, pod.Name, metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp == nil {
		t.Fatalf("pod %s: %v, %v; want it still there, marked for deletion", pod.Name, got, err)
	}
}

func TestPodIsDeletedOnceItsVolumesAreTornDown(t *testing.T) {
	e := newEnv(t, k8stest.New(t), nil)
	pod := e.createPod(t, "with-volume")
	key := volume.PodKey{Volume: volume.PersistentName("d", "h"), Pod: pod.UID}
	id := volume.ID{Driver: "d", Handle: "h", PVName: "pv", AccessType: volume.Filesystem}
	e.actual.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: "/t"})

	e.markForDeletion(t, pod)
	e.waitForLog(t, "still has volumes")
	e.stillThere(t, pod)

	// The reconciler unpublishes the volume and forgets the pod's status:
	// the forget hook tells the Finalizer.
	e.actual.ForgetPod(key)
	e.fin.PodChanged(pod.UID)
	e.podGone(t, pod)
}

func TestPodStillInTheDesiredStateIsNotDeleted(t *testing.T) {
	e := newEnv(t, k8stest.New(t), nil)
	pod := e.createPod(t, "wanted")
	e.desired.SetPod(dsw.Pod{Info: volume.PodInfo{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}})
	e.markForDeletion(t, pod)
	e.waitForLog(t, "still in the desired state")
	e.stillThere(t, pod)
	e.desired.DeletePod(pod.UID)
	e.fin.PodChanged(pod.UID)
	e.podGone(t, pod)
}

func TestPodWithoutVolumesIsDeletedWhenMarked(t *testing.T) {
	e := newEnv(t, k8stest.New(t), nil)
	pod := e.createPod(t, "plain")
	other := e.createPod(t, "running")
	e.markForDeletion(t, pod)
	e.podGone(t, pod)
	if _, err := e.f.Client.CoreV1().Pods(other.Namespace).Get(e.ctx, other.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("a pod not marked for deletion was touched: %v", err)
	}
}

func TestVolumeDirectoryOnDiskHoldsThePodBack(t *testing.T) {
	e := newEnv(t, k8stest.New(t), nil)
	pod := e.createPod(t, "dir-left")
	pub, err := e.layout.Publishing(pod.UID, "pv-1", volume.Filesystem)
	if err != nil {
		t.Fatal(err)
	}
	// A publish in flight: its record is written before NodePublishVolume.
	if err := os.MkdirAll(pub.Dir, 0o750); err != nil {
		t.Fatal(err)
	}
	e.markForDeletion(t, pod)
	e.waitForLog(t, "volume directories of the pod are still on disk")
	e.stillThere(t, pod)
	if err := os.RemoveAll(filepath.Dir(pub.Dir)); err != nil {
		t.Fatal(err)
	}
	e.podGone(t, pod) // retried with backoff
}

// stalePods serves one pod object regardless of what the API holds now.
type stalePods struct{ pod *corev1.Pod }

func (s stalePods) Pod(uid types.UID) (*corev1.Pod, bool) {
	return s.pod, uid == s.pod.UID
}
func (stalePods) OnPodChange(func(types.UID)) {}

func TestUIDPreconditionSparesANewPodOfTheSameName(t *testing.T) {
	f := k8stest.New(t)
	_, ctx := ktesting.NewTestContext(t)
	// The cache still shows the old pod, marked for deletion; the API
	// already has a new pod under that name.
	now := metav1.Now()
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reused", Namespace: f.Namespace, UID: "old-uid", DeletionTimestamp: &now}}
	e := newEnv(t, f, stalePods{pod: old})
	current, err := f.Client.CoreV1().Pods(f.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "reused", Namespace: f.Namespace},
		Spec:       corev1.PodSpec{NodeName: f.NodeName, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.fin.PodChanged("old-uid")
	e.waitForLog(t, "replaced by another of the same name")
	got, err := f.Client.CoreV1().Pods(f.Namespace).Get(ctx, "reused", metav1.GetOptions{})
	if err != nil || got.UID != current.UID || got.DeletionTimestamp != nil {
		t.Errorf("the new pod: %v, %v; want it untouched", got, err)
	}
}
