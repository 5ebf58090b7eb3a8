package status_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/metrics"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const testNode = "node-1"

var (
	volA = volume.PersistentName("d.csi.test", "a")
	volB = volume.PersistentName("d.csi.test", "b")
	volC = volume.PersistentName("d.csi.test", "c")
)

// attached is what the attach/detach controller wrote on the Node.
var attached = []corev1.AttachedVolume{{Name: corev1.UniqueVolumeName(volA), DevicePath: ""}}

type inUseFixture struct {
	client  *fake.Clientset
	writer  *status.VolumesInUse
	limiter *countingLimiter
	ctx     context.Context

	mu       sync.Mutex
	reported [][]volume.Name // onReported calls
}

// startInUse starts a writer over a fake clientset holding the Node, with
// status.volumesAttached set by "the attach/detach controller".
func startInUse(t *testing.T) *inUseFixture {
	t.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: testNode},
		Status:     corev1.NodeStatus{VolumesAttached: attached},
	}
	f := &inUseFixture{client: fake.NewClientset(node), limiter: newCountingLimiter(), ctx: testContext(t)}
	w, err := status.NewVolumesInUse(status.VolumesInUseConfig{
		Client:   f.client,
		NodeName: testNode,
		Queue:    status.QueueOptions{RateLimiter: f.limiter},
	})
	if err != nil {
		t.Fatalf("NewVolumesInUse() error: %v", err)
	}
	f.writer = w
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	onReported := func(names []volume.Name) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.reported = append(f.reported, names)
	}
	go func() { defer close(done); w.Run(ctx, onReported) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *inUseFixture) node(t *testing.T) *corev1.Node {
	t.Helper()
	node, err := f.client.CoreV1().Nodes().Get(f.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting Node: %v", err)
	}
	return node
}

// waitInUse waits until the Node shows exactly want in volumesInUse and
// the writer reports the same.
func (f *inUseFixture) waitInUse(t *testing.T, want ...volume.Name) *corev1.Node {
	t.Helper()
	wantList := make([]corev1.UniqueVolumeName, 0, len(want))
	for _, n := range want {
		wantList = append(wantList, corev1.UniqueVolumeName(n))
	}
	var node *corev1.Node
	waitFor(f.ctx, t, "volumesInUse", func() (bool, error) {
		node = f.node(t)
		got := node.Status.VolumesInUse
		if got == nil {
			got = []corev1.UniqueVolumeName{}
		}
		return slices.Equal(got, wantList) && reportsExactly(f.writer, want), nil
	})
	if !reflect.DeepEqual(node.Status.VolumesAttached, attached) {
		t.Errorf("volumesAttached = %v, want %v kept", node.Status.VolumesAttached, attached)
	}
	return node
}

// reportsExactly says whether, of the test's volumes, the writer reports
// exactly names.
func reportsExactly(w *status.VolumesInUse, names []volume.Name) bool {
	for _, n := range []volume.Name{volA, volB, volC} {
		if w.Reported(n) != slices.Contains(names, n) {
			return false
		}
	}
	return true
}

func (f *inUseFixture) onReported() [][]volume.Name {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reported)
}

// TestVolumesInUseWritesChangesOnly: the first Set is written sorted and
// de-duplicated, the same set again is not written, a smaller set and the
// empty set are; volumesAttached is never touched; Reported follows what
// was written; onReported gets the newly reported names.
func TestVolumesInUseWritesChangesOnly(t *testing.T) {
	f := startInUse(t)

	f.writer.Set([]volume.Name{volB, volA, volB})
	f.waitInUse(t, volA, volB)
	f.writer.Set([]volume.Name{volA, volB})
	f.writer.Set([]volume.Name{volB, volA})
	f.writer.Set([]volume.Name{volB})
	f.waitInUse(t, volB) // and volA is no longer Reported
	f.writer.Set(nil)
	node := f.waitInUse(t)
	if node.Status.VolumesInUse != nil {
		t.Errorf("volumesInUse = %#v, want the field removed", node.Status.VolumesInUse)
	}

	got := patches(f.client, "nodes")
	want := []string{
		`{"status":{"volumesInUse":["kubernetes.io/csi/d.csi.test^a","kubernetes.io/csi/d.csi.test^b"]}}`,
		`{"status":{"volumesInUse":["kubernetes.io/csi/d.csi.test^b"]}}`,
		`{"status":{"volumesInUse":null}}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("patches:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r := f.onReported(); !reflect.DeepEqual(r, [][]volume.Name{{volA, volB}}) {
		t.Errorf("onReported calls = %v, want one with [%s %s]", r, volA, volB)
	}
}

// TestVolumesInUseCoalesces changes the set many times while a write is in
// flight: exactly one more write follows, with the last set.
func TestVolumesInUseCoalesces(t *testing.T) {
	f := startInUse(t)
	g := newGate(f.client, "nodes")

	f.writer.Set([]volume.Name{volA})
	<-g.entered
	if f.writer.Reported(volA) {
		t.Errorf("Reported(%s) = true while its write is in flight", volA)
	}
	f.writer.Set([]volume.Name{volA, volB})
	f.writer.Set([]volume.Name{volB})
	f.writer.Set([]volume.Name{volA, volB, volC})
	f.writer.Set([]volume.Name{volC, volB})
	close(g.release)
	f.waitInUse(t, volB, volC)

	if got := patches(f.client, "nodes"); len(got) != 2 {
		t.Errorf("%d patches, want 2 (first set, last set):\n%s", len(got), strings.Join(got, "\n"))
	}
	// onReported runs right after Reported changes.
	waitFor(f.ctx, t, "onReported", func() (bool, error) { return len(f.onReported()) == 2, nil })
	if r := f.onReported(); !reflect.DeepEqual(r, [][]volume.Name{{volA}, {volB, volC}}) {
		t.Errorf("onReported calls = %v, want [[%s] [%s %s]]", r, volA, volB, volC)
	}
}

// TestVolumesInUseRetries fails the first writes (the Node does not exist
// yet, then a server error) and checks that the set is still written, and
// not reported before.
func TestVolumesInUseRetries(t *testing.T) {
	f := startInUse(t)
	var mu sync.Mutex
	errs := []error{
		apierrors.NewNotFound(corev1.Resource("nodes"), testNode),
		apierrors.NewInternalError(errors.New("etcd is down")),
	}
	reportedDuringFailures := false
	f.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) == 0 {
			return false, nil, nil
		}
		reportedDuringFailures = reportedDuringFailures || f.writer.Reported(volA)
		err := errs[0]
		errs = errs[1:]
		return true, nil, err
	})

	f.writer.Set([]volume.Name{volA})
	f.waitInUse(t, volA)
	if n := f.limiter.NumRequeues("volumesInUse"); n != 2 {
		t.Errorf("%d retries, want 2", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if reportedDuringFailures {
		t.Errorf("Reported(%s) was true before a write succeeded", volA)
	}
}

// TestVolumesInUseNothingBeforeFirstSet: the empty set is not written on
// start; the first write is the first Set.
func TestVolumesInUseNothingBeforeFirstSet(t *testing.T) {
	f := startInUse(t)
	f.writer.Set([]volume.Name{volC})
	f.waitInUse(t, volC)
	if got := patches(f.client, "nodes"); len(got) != 1 {
		t.Errorf("patches = %v, want only the first Set's", got)
	}
}

func TestNewVolumesInUseValidates(t *testing.T) {
	for name, cfg := range map[string]status.VolumesInUseConfig{
		"no client": {NodeName: testNode},
		"no node":   {Client: fake.NewClientset()},
	} {
		if _, err := status.NewVolumesInUse(cfg); err == nil {
			t.Errorf("%s: NewVolumesInUse() succeeded, want an error", name)
		}
	}
}

// TestQueueMetrics gives the writers' queues the lifecycle's workqueue
// metrics provider: a scrape shows them under their names.
func TestQueueMetrics(t *testing.T) {
	ctx := testContext(t)
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	if err != nil {
		t.Fatalf("metrics.New() error: %v", err)
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}, testPod("p1"))
	queue := status.QueueOptions{MetricsProvider: m.WorkqueueProvider()}
	inUse, err := status.NewVolumesInUse(status.VolumesInUseConfig{Client: client, NodeName: testNode, Queue: queue})
	if err != nil {
		t.Fatalf("NewVolumesInUse() error: %v", err)
	}
	conds, err := status.NewPodConditions(status.PodConditionsConfig{Client: client, Queue: queue})
	if err != nil {
		t.Fatalf("NewPodConditions() error: %v", err)
	}
	inUse.Set([]volume.Name{volA})
	conds.Set(status.Ready(podInfo(testPod("p1"))))
	conds.Set(status.Ready(volume.PodInfo{UID: "uid-p2", Namespace: "ns", Name: "p2"}))

	want := `
# HELP workqueue_adds_total Total number of adds handled by workqueue
# TYPE workqueue_adds_total counter
workqueue_adds_total{name="csi_volmgr_pod_conditions"} 2
workqueue_adds_total{name="csi_volmgr_volumes_in_use"} 1
# HELP workqueue_depth Current depth of workqueue
# TYPE workqueue_depth gauge
workqueue_depth{name="csi_volmgr_pod_conditions"} 2
workqueue_depth{name="csi_volmgr_volumes_in_use"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "workqueue_adds_total", "workqueue_depth"); err != nil {
		t.Fatal(err)
	}

	// Once the writers run, the queues drain.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { inUse.Run(runCtx, nil); done <- struct{}{} }()
	go func() { conds.Run(runCtx, 1); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()
	waitFor(ctx, t, "empty queues", func() (bool, error) {
		err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP workqueue_depth Current depth of workqueue
# TYPE workqueue_depth gauge
workqueue_depth{name="csi_volmgr_pod_conditions"} 0
workqueue_depth{name="csi_volmgr_volumes_in_use"} 0
`), "workqueue_depth")
		return err == nil, nil
	})
}
