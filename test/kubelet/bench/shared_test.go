package bench_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

const (
	// sharedPods is how many pods share the one volume of BenchmarkSharedVolume.
	sharedPods = 50
	// sharedDelay is the plugin's delay in each NodeStageVolume and
	// NodePublishVolume of BenchmarkSharedVolume.
	sharedDelay = 100 * time.Millisecond
)

// BenchmarkSharedVolume creates sharedPods pods at once that all use one
// ReadWriteMany PVC, against a plugin that takes sharedDelay in every
// NodeStageVolume and NodePublishVolume, and prints for both agents the
// time from the first Create sent until every pod's NodePublishVolume
// returned. The ideal is one stage and then the publishes side by side:
// about 2 × sharedDelay. The kubelet runs the operations of a device-
// mountable volume one at a time (its nestedpendingoperations key the
// volume, not the pod), so its figure grows with the pods.
//
//	make bench-kubelet   (or: go test -run='^$' -bench=SharedVolume -benchtime=1x ./bench/)
func BenchmarkSharedVolume(b *testing.B) {
	w := newWorld(b.Context(), b, worldOptions{driver: "shared.kubelet-bench.csi-volmgr.io", volumes: 1,
		accessMode: corev1.ReadWriteMany})
	v := w.volumes[0]
	if err := w.plugin.SetFaults(
		plugin.FaultRule{Method: "NodeStageVolume", VolumeID: v.handle, Delay: sharedDelay},
		plugin.FaultRule{Method: "NodePublishVolume", VolumeID: v.handle, Delay: sharedDelay},
	); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		sideBySide(b.Context(), b, w, scenario{
			name: fmt.Sprintf("%d pods sharing one RWX volume, plugin %v per stage and publish", sharedPods, sharedDelay),
			run: func(ctx context.Context, b *testing.B, w *world, a *agent) []figure {
				pods := w.creator.CoreV1().Pods(w.fx.Namespace)
				began := time.Now()
				parallelN(b, burstCreators, sharedPods, func(i int) error {
					_, err := pods.Create(ctx, newPod(fmt.Sprintf("%s-s-%02d", a.tag, i), w.fx.NodeName, v.claim), metav1.CreateOptions{})
					return err
				})
				var last time.Time
				waitFor(ctx, b, 10*time.Millisecond, runTimeout, fmt.Sprintf("%s published %d pods", a.kind.name, sharedPods), func() (bool, error) {
					if _, err := w.journal.poll(); err != nil {
						return false, err
					}
					ok := 0
					for _, c := range w.journal.calls(v.handle, began, "NodePublishVolume") {
						if c.ok() {
							ok++
							if c.end.After(last) {
								last = c.end
							}
						}
					}
					return ok >= sharedPods, nil
				})
				all := last.Sub(began)
				w.deletePods(ctx, b, a, 1)
				return []figure{{name: fmt.Sprintf("first create → every pod published (s; ideal %.1f)", (2 * sharedDelay).Seconds()),
					key: "shared_all_s", value: all.Seconds()}}
			},
		})
	}
}
