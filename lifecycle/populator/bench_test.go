package populator_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	benchNodePods  = 50     // this node: 50 pods × 1 PVC
	benchForeign   = 20_000 // other nodes': 20,000 PVCs + 20,000 PVs
	benchCreators  = 16     // parallel creators
	benchCreateQPS = 1000   // client-side rate limit of the creators' clientset
)

// BenchmarkSourceScale shows that what the node's Source caches, and the
// process heap, do not grow with the objects of other nodes: it measures
// both with 0 and with 20,000 foreign PVCs + 20,000 foreign PVs in the API
// server, for a node running 50 pods × 1 PVC. One op is starting the
// Source, dsw and populator against the loaded API server until the
// desired state is complete. For contrast it also measures the
// ClusterWideInformers option once.
//
//	make bench   (or: go test -run='^$' -bench=SourceScale -benchtime=1x ./lifecycle/populator/)
func BenchmarkSourceScale(b *testing.B) {
	fx := k8stest.New(b)
	ctx := klog.NewContext(b.Context(), logr.Discard())
	fx.CreateNode(b)
	creator := fastClient(b, fx.Config)
	api := apiObjects{client: creator, namespace: fx.Namespace, node: fx.NodeName}

	// This node's pods, each with one bound CSI claim.
	for i := range benchNodePods {
		c := api.claim(ctx, b, fmt.Sprintf("mine-%d", i), fmt.Sprintf("%s-mine-%d", fx.Namespace, i))
		api.volume(ctx, b, c.Spec.VolumeName, fmt.Sprintf("mine-%d", i), c)
		api.pod(ctx, b, fmt.Sprintf("app-%d", i), c.Name)
	}

	at0 := measureStack(ctx, b, fx.Client, fx.NodeName, false)

	began := time.Now()
	createForeign(ctx, b, creator, fx.Namespace)
	createTime := time.Since(began)

	b.ResetTimer()
	var at20k measurement
	for range b.N {
		at20k = measureStack(ctx, b, fx.Client, fx.NodeName, false)
	}
	b.StopTimer()
	wide := measureStack(ctx, b, fx.Client, fx.NodeName, true)

	b.ReportMetric(float64(at0.objects), "cached_objs@0foreign")
	b.ReportMetric(float64(at20k.objects), "cached_objs@20kforeign")
	b.ReportMetric(at0.heapMiB, "heap_MiB@0foreign")
	b.ReportMetric(at20k.heapMiB, "heap_MiB@20kforeign")
	b.ReportMetric(at0.stackMiB, "source_heap_MiB@0foreign")
	b.ReportMetric(at20k.stackMiB, "source_heap_MiB@20kforeign")
	b.ReportMetric(float64(at20k.watches), "watches@20kforeign")
	b.ReportMetric(at20k.populate.Seconds(), "populate_s@20kforeign")
	b.ReportMetric(float64(wide.objects), "clusterwide_cached_objs@20kforeign")
	b.ReportMetric(wide.stackMiB, "clusterwide_source_heap_MiB@20kforeign")
	b.ReportMetric(createTime.Seconds(), "create_40k_objs_s")
	b.Logf("node: %d pods × 1 PVC; foreign: %d PVCs + %d PVs created in %v by %d creators",
		benchNodePods, benchForeign, benchForeign, createTime.Round(time.Millisecond), benchCreators)
	b.Logf("by name @0:      %+v", at0)
	b.Logf("by name @20k:    %+v", at20k)
	b.Logf("cluster-wide @20k: %+v", wide)

	// The point of the benchmark: flat in the foreign objects.
	if at20k.objects != at0.objects {
		b.Errorf("cached objects grew with foreign objects: %d at 0, %d at 20k", at0.objects, at20k.objects)
	}
	if wide.objects < 2*benchForeign {
		b.Errorf("cluster-wide informers cached %d objects, expected at least %d: the contrast measurement is broken",
			wide.objects, 2*benchForeign)
	}
}

type measurement struct {
	objects, watches  int
	heapMiB, stackMiB float64 // process heap; its growth from starting the stack
	populate          time.Duration
}

// measureStack starts a Source, dsw and populator for the node, waits until
// every pod's volume is desired, measures, and stops them again.
func measureStack(ctx context.Context, b *testing.B, client kubernetes.Interface, node string, clusterWide bool) measurement {
	b.Helper()
	before := heapMiB()
	began := time.Now()
	s := startStack(ctx, b, client, stackOptions{node: node, clusterWide: clusterWide})
	defer s.stop()
	eventually(ctx, b, "every pod's volume desired", func() bool {
		return s.store.Counts().PodVolumes == benchNodePods
	})
	m := measurement{populate: time.Since(began)}
	st := s.src.Stats()
	m.objects, m.watches = st.TotalObjects(), st.TotalWatches()
	m.heapMiB = heapMiB()
	m.stackMiB = m.heapMiB - before
	return m
}

func heapMiB() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// createForeign creates benchForeign claims and volumes, bound to each
// other, that no pod of the node uses.
func createForeign(ctx context.Context, b *testing.B, client kubernetes.Interface, namespace string) {
	b.Helper()
	core := client.CoreV1()
	parallel(b, benchForeign, func(i int) error {
		name := fmt.Sprintf("foreign-%05d", i)
		c, err := core.PersistentVolumeClaims(namespace).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				VolumeName:  namespace + "-" + name,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating PVC %s: %w", name, err)
		}
		_, err = core.PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: namespace + "-" + name},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				ClaimRef:    &corev1.ObjectReference{Namespace: namespace, Name: name, UID: c.UID},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: driver, VolumeHandle: name}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating PV for %s: %w", name, err)
		}
		return nil
	})
}

// parallel runs fn(0..n-1) on benchCreators goroutines and fails b on the
// first error.
func parallel(b *testing.B, n int, fn func(i int) error) {
	b.Helper()
	var (
		next   atomic.Int64
		failed atomic.Bool
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
	)
	for range benchCreators {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() {
					return
				}
				if err := fn(i); err != nil {
					failed.Store(true)
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		b.Fatal(errs[0])
	}
}

// fastClient is a clientset for the creators without the default
// client-side rate limit (5 QPS), which would make 40,000 creates take hours.
func fastClient(b *testing.B, cfg *rest.Config) kubernetes.Interface {
	b.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = benchCreateQPS, 2*benchCreateQPS
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return client
}
