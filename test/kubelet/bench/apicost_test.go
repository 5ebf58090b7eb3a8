package bench_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// apiPods is how many pods BenchmarkAPICost creates one after another.
	apiPods = 100
	// EnvForeign names an environment variable with how many foreign
	// objects BenchmarkAPICost creates, half PVCs and half PVs (default
	// 20000).
	EnvForeign = "KUBELET_BENCH_FOREIGN"
	// foreignLabel marks the foreign PVs of one run, for their removal.
	foreignLabel = "csi-volmgr.io/kubelet-bench-foreign"
)

// BenchmarkAPICost runs both agents through a counting proxy in front of
// kube-apiserver (countingProxy) and prints what each asks of the API
// server: requests at start; per pod, while apiPods pods are created one
// after another and published (GETs, LISTs, WATCHes, writes); the most
// watches open at once; and, with EnvForeign objects that no pod of the node
// references (PVCs in another namespace, PVs of no claim of the node)
// created meanwhile, how much the agent's heap grew and how many requests
// they caused; then requests per pod for the teardown.
//
//	make bench-kubelet   (or: go test -run='^$' -bench=APICost -benchtime=1x ./bench/)
func BenchmarkAPICost(b *testing.B) {
	idle := idleWindow(b)
	foreign := intList(b, EnvForeign, []int{20000})[0]
	book.setting("API cost foreign objects", foreign)
	w := newWorld(b.Context(), b, worldOptions{driver: "apicost.kubelet-bench.csi-volmgr.io", volumes: apiPods})
	proxy := startProxy(b, w)
	w.proxy = proxy
	for range b.N {
		proxy.take()
		sideBySide(b.Context(), b, w, scenario{
			name: fmt.Sprintf("API cost through a counting proxy: %d pods one after another, %d foreign PVCs/PVs", apiPods, foreign),
			pods: apiPods,
			run: func(ctx context.Context, b *testing.B, w *world, a *agent) []figure {
				startup, _ := proxy.take()
				w.createSerially(ctx, b, a, apiPods)
				setup, maxOpen := proxy.take()
				time.Sleep(idle) // settle; the idle cost is BenchmarkSteadyState's
				proxy.take()
				_, heap0, _ := agentMemory(ctx, b, a)
				began := time.Now()
				w.createForeign(ctx, b, foreign, a.tag)
				b.Logf("%d foreign objects created in %v", foreign, time.Since(began).Round(time.Millisecond))
				time.Sleep(10 * time.Second)
				_, heap1, _ := agentMemory(ctx, b, a)
				foreignCounts, _ := proxy.take()
				w.deleteForeign(ctx, b, a.tag)
				proxy.take()
				w.deletePods(ctx, b, a, apiPods)
				teardown, _ := proxy.take()

				var sb []string
				for _, c := range []struct {
					what   string
					counts map[string]int
				}{{"start", startup}, {"setup", setup}, {"foreign", foreignCounts}, {"teardown", teardown}} {
					text, _ := summarize(c.counts)
					sb = append(sb, fmt.Sprintf("\n  %s %s: %s", a.kind.name, c.what, text))
				}
				details(b, a.kind.name+" API requests by phase", fmt.Sprint(sb))
				_, st := summarize(startup)
				_, su := summarize(setup)
				_, fo := summarize(foreignCounts)
				_, td := summarize(teardown)
				writes := func(m map[string]int) int { return m["CREATE"] + m["UPDATE"] + m["PATCH"] + m["DELETE"] }
				total := func(m map[string]int) int { return m["GET"] + m["LIST"] + m["WATCH"] + writes(m) }
				perPod := func(v int) float64 { return float64(v) / apiPods }
				return []figure{
					{name: "requests at start", key: "api_start_requests", value: float64(total(st))},
					{name: "per pod published: GET", key: "api_pod_get", value: perPod(su["GET"])},
					{name: "per pod published: LIST", key: "api_pod_list", value: perPod(su["LIST"])},
					{name: "per pod published: WATCH", key: "api_pod_watch", value: perPod(su["WATCH"])},
					{name: "per pod published: writes", key: "api_pod_writes", value: perPod(writes(su))},
					{name: "per pod published: all requests", key: "api_pod_requests", value: perPod(total(su))},
					{name: fmt.Sprintf("watches open at most, %d pods", apiPods), key: "api_watches_open", value: float64(maxOpen)},
					{name: fmt.Sprintf("heap growth with %d foreign objects (MiB)", foreign), key: "api_foreign_heap_mib", value: (heap1 - heap0) / (1 << 20)},
					{name: "requests meanwhile (any cause)", key: "api_foreign_requests", value: float64(total(fo))},
					{name: "per pod torn down: all requests", key: "api_teardown_requests", value: perPod(total(td))},
				}
			},
		})
	}
}

// createForeign creates n/2 PVCs in a namespace of their own (named with
// suffix: envtest never finishes deleting a namespace) and n/2 PVs of
// another driver, none of which a pod of the node references.
func (w *world) createForeign(ctx context.Context, tb testing.TB, n int, suffix string) {
	tb.Helper()
	core := w.creator.CoreV1()
	ns := w.fx.Namespace + "-f" + suffix
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("creating namespace %s: %v", ns, err)
	}
	size := resource.MustParse("1Gi")
	parallelN(tb, burstCreators, n/2, func(i int) error {
		if _, err := core.PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("foreign-%05d", i)},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := core.PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%05d", ns, i), Labels: map[string]string{foreignLabel: ns}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: "foreign.kubelet-bench.csi-volmgr.io", VolumeHandle: fmt.Sprintf("foreign-%05d", i)}},
			},
		}, metav1.CreateOptions{})
		return err
	})
}

// deleteForeign deletes what createForeign created.
func (w *world) deleteForeign(ctx context.Context, tb testing.TB, suffix string) {
	tb.Helper()
	ns := w.fx.Namespace + "-f" + suffix
	core := w.creator.CoreV1()
	if err := core.PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		tb.Fatalf("deleting the foreign PVCs: %v", err)
	}
	if err := core.PersistentVolumes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: foreignLabel + "=" + ns}); err != nil {
		tb.Fatalf("deleting the foreign PVs: %v", err)
	}
	if err := core.Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		tb.Fatalf("deleting namespace %s: %v", ns, err)
	}
}
