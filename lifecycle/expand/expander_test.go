package expand_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/expand"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestStaleCachedClaimIsReadBeforeExpanding: the volume was expanded and the
// resizer set the claim to NodeResizePending, but the cache still holds the
// claim as it was before the resize (a settled claim is read again only
// every period, and the volume was read first). The expander reads the
// claim before acting on it: one NodeExpandVolume, and the claim's status
// is marked finished with a write the API server accepts. Acting on the
// cached claim took the older resizers' path and wrote the status with its
// stale resourceVersion: a Conflict, and NodeExpandVolume again on every
// retry.
func TestStaleCachedClaimIsReadBeforeExpanding(t *testing.T) {
	stale := claim("1", nil)
	current := claim("3", func(st *corev1.PersistentVolumeClaimStatus) {
		st.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}
		st.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{
			corev1.ResourceStorage: corev1.PersistentVolumeClaimNodeResizePending,
		}
	})
	client := fake.NewClientset(current)
	rejectStaleStatusPatches(client)
	claims := &claims{cached: stale, pv: volumeOf("2Gi"), client: client}
	ops := &operations{}
	processed := newWorkDone()
	exp := startExpander(t, claims, client, ops, processed)

	exp.VolumeChanged(volName)
	eventuallyClaim(t, client, "marked finished at 2Gi", func(c *corev1.PersistentVolumeClaim) bool {
		q := c.Status.Capacity[corev1.ResourceStorage]
		return q.Cmp(resource.MustParse("2Gi")) == 0 && len(c.Status.AllocatedResourceStatuses) == 0
	}, ops)
	// A later change of the pod's objects finds nothing to do.
	claims.setCached(claimFrom(t, client))
	processed.drain()
	exp.VolumeChanged(volName)
	processed.wait(t)
	want := resource.MustParse("2Gi")
	if calls := ops.calls(); len(calls) != 1 || calls[0] != want.Value() {
		t.Errorf("NodeExpandVolume calls (required bytes) = %v, want one of 2Gi", calls)
	}
	if n := claims.readCount(); n != 1 {
		t.Errorf("the claim was read from the API server %d times, want 1", n)
	}
}

const volName = volume.Name("kubernetes.io/csi/driver^vol-1")

var podUID = types.UID("pod-1")

func claim(rv string, edit func(*corev1.PersistentVolumeClaimStatus)) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns", UID: "uid-data", ResourceVersion: rv},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeName:  "pv-data",
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse("2Gi")}},
		},
		Status: corev1.PersistentVolumeClaimStatus{
			Phase:    corev1.ClaimBound,
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
		},
	}
	if edit != nil {
		edit(&c.Status)
	}
	return c
}

func volumeOf(size string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-data", ResourceVersion: "2"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "uid-data"},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

// rejectStaleStatusPatches makes the fake API server answer a patch whose
// resourceVersion precondition is not the claim's current one with
// Conflict, as kube-apiserver does.
func rejectStaleStatusPatches(client *fake.Clientset) {
	client.PrependReactor("patch", "persistentvolumeclaims", func(action clienttesting.Action) (bool, runtime.Object, error) {
		patch := action.(clienttesting.PatchAction)
		var body struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(patch.GetPatch(), &body); err != nil || body.Metadata.ResourceVersion == "" {
			return false, nil, nil
		}
		obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), patch.GetNamespace(), patch.GetName())
		if err != nil {
			return false, nil, nil
		}
		if obj.(*corev1.PersistentVolumeClaim).ResourceVersion != body.Metadata.ResourceVersion {
			return true, nil, apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), patch.GetName(),
				errStale)
		}
		return false, nil, nil
	})
}

type staleError struct{}

func (staleError) Error() string { return "the object has been modified" }

var errStale = staleError{}

func claimFrom(t *testing.T, client kubernetes.Interface) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := client.CoreV1().PersistentVolumeClaims("ns").Get(t.Context(), "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func eventuallyClaim(t *testing.T, client kubernetes.Interface, what string, ok func(*corev1.PersistentVolumeClaim) bool, ops *operations) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(claimFrom(t, client)) {
		if time.Now().After(deadline) {
			c := claimFrom(t, client)
			t.Fatalf("claim not %s after 10s; NodeExpandVolume called %d times; claim capacity %v, resize statuses %v",
				what, len(ops.calls()), c.Status.Capacity, c.Status.AllocatedResourceStatuses)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startExpander(t *testing.T, claims *claims, client kubernetes.Interface, ops *operations, processed workDone) *expand.Expander {
	t.Helper()
	info := volume.PodInfo{UID: podUID, Namespace: "ns", Name: "app"}
	use := dsw.Use{
		Name:   volName,
		Source: volume.Source{ID: volume.ID{Driver: "driver", Handle: "vol-1", PVName: "pv-data"}},
		Volume: volume.PodVolume{Pod: info, SpecName: "data"},
	}
	exp, err := expand.New(expand.Config{
		Claims: claims, Client: client, Desired: desired{use: use}, Actual: published{},
		Operations: ops, Events: noEvents{}, NodeName: "node-1",
		RetryBaseDelay: time.Millisecond, RetryMaxDelay: 10 * time.Millisecond,
		MetricsProvider: processed,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); exp.Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
	return exp
}

// claims is the Source: a cache holding cached, and the API server.
type claims struct {
	client kubernetes.Interface
	pv     *corev1.PersistentVolume

	mu     sync.Mutex
	cached *corev1.PersistentVolumeClaim
	reads  int
}

func (c *claims) PVC(_, _ string) (*corev1.PersistentVolumeClaim, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cached, nil
}

func (c *claims) PV(string) (*corev1.PersistentVolume, error) { return c.pv, nil }

func (c *claims) ReadPVC(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c *claims) setCached(pvc *corev1.PersistentVolumeClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cached = pvc
}

func (c *claims) readCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// desired holds one pod's use of one volume.
type desired struct{ use dsw.Use }

func (d desired) Volume(name volume.Name) (volume.Source, bool) {
	return d.use.Source, name == d.use.Name
}

func (d desired) VolumePods(name volume.Name) []types.UID {
	if name != d.use.Name {
		return nil
	}
	return []types.UID{d.use.Volume.Pod.UID}
}

func (d desired) PodVolume(key volume.PodKey) (dsw.Use, bool) {
	return d.use, key == d.use.Key()
}

func (d desired) Pod(uid types.UID) (dsw.Pod, bool) {
	return dsw.Pod{Info: d.use.Volume.Pod, Uses: []dsw.Use{d.use}}, uid == d.use.Volume.Pod.UID
}

// published says every use is published.
type published struct{}

func (published) Pod(key volume.PodKey) (asw.Pod, bool) {
	return asw.Pod{Key: key, State: volume.Published}, true
}

// operations records NodeExpandVolume's required bytes and succeeds.
type operations struct {
	mu       sync.Mutex
	required []int64
}

func (o *operations) Expand(_ context.Context, _ volume.PodKey, _ volume.Source, requiredBytes int64) (int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.required = append(o.required, requiredBytes)
	return requiredBytes, nil
}

func (o *operations) MarkMountUncertain(context.Context, volume.PodKey, volume.Step, error) error {
	return nil
}

func (o *operations) calls() []int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int64(nil), o.required...)
}

// workDone is the expansion queue's metrics provider: it tells of each
// item the expander has finished processing (its work duration is observed
// then), so that a test can wait for a sync to end.
type workDone chan struct{}

func newWorkDone() workDone { return make(workDone, 1000) }

func (w workDone) Observe(float64) {
	select {
	case w <- struct{}{}:
	default:
	}
}

// drain forgets the items processed so far.
func (w workDone) drain() {
	for {
		select {
		case <-w:
		default:
			return
		}
	}
}

// wait waits for the next item processed.
func (w workDone) wait(t *testing.T) {
	t.Helper()
	select {
	case <-w:
	case <-time.After(10 * time.Second):
		t.Fatal("the expansion queue processed nothing in 10s")
	}
}

func (w workDone) NewWorkDurationMetric(string) workqueue.HistogramMetric { return w }
func (workDone) NewDepthMetric(string) workqueue.GaugeMetric              { return noMetric{} }
func (workDone) NewAddsMetric(string) workqueue.CounterMetric             { return noMetric{} }
func (workDone) NewLatencyMetric(string) workqueue.HistogramMetric        { return noMetric{} }
func (workDone) NewRetriesMetric(string) workqueue.CounterMetric          { return noMetric{} }
func (workDone) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (workDone) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}

type noMetric struct{}

func (noMetric) Inc()            {}
func (noMetric) Dec()            {}
func (noMetric) Set(float64)     {}
func (noMetric) Observe(float64) {}

type noEvents struct{}

func (noEvents) Pod(volume.PodInfo, string, string, string) {}

func (noEvents) Claim(string, string, types.UID, string, string, string) {}
