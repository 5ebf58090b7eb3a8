package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// BenchmarkManifestDirectory measures the standalone mode's cost per file
// (issue 17): a directory of one object per file — pods, their claims and
// their volumes, a third each — is read by New, and then one pod's file is
// changed and applied again, 100 times. It reports the load time and the
// time per change; a change costs O(that file), so the time per change
// stays flat from 1,000 to 10,000 files (it grew with the directory
// before: 1,000 pods in 3,000 files took 115 s to publish).
//
//	go test -run='^$' -bench=ManifestDirectory -benchtime=1x ./lifecycle/source/manifests/
func BenchmarkManifestDirectory(b *testing.B) {
	for _, files := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			dir := b.TempDir()
			triples := files / 3
			for i := range triples {
				writeTriple(b, dir, i, "a")
			}
			ctx := klog.NewContext(b.Context(), klog.Background().V(1))
			const changes = 100
			for range b.N {
				began := time.Now()
				src, err := New(ctx, Config{Dir: dir, NodeName: testNode})
				if err != nil {
					b.Fatal(err)
				}
				load := time.Since(began)
				if n := len(src.Pods()); n != triples {
					b.Fatalf("%d pods read, want %d", n, triples)
				}
				began = time.Now()
				for i := range changes {
					name := fmt.Sprintf("pod-%05d.yaml", i%triples)
					writeFile(b, dir, name, benchPodYAML(i%triples, fmt.Sprintf("v%d", i)))
					src.reload(name)
				}
				perChange := time.Since(began) / changes
				_ = src.watcher.Close()
				src.queue.ShutDown()
				b.ReportMetric(load.Seconds(), "load_s")
				b.ReportMetric(float64(perChange.Microseconds()), "us_per_change")
				fmt.Printf("[%s] %d files (%d pods, claims, volumes): read in %v; one file changed: %v per change (read, parse, apply)\n",
					b.Name(), 3*triples, triples, load.Round(time.Millisecond), perChange.Round(time.Microsecond))
			}
		})
	}
}

func writeTriple(tb testing.TB, dir string, i int, label string) {
	tb.Helper()
	writeFile(tb, dir, fmt.Sprintf("pod-%05d.yaml", i), benchPodYAML(i, label))
	writeFile(tb, dir, fmt.Sprintf("pvc-%05d.yaml", i), fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data-%05d
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
  volumeName: pv-%05d
`, i, i))
	writeFile(tb, dir, fmt.Sprintf("pv-%05d.yaml", i), fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-%05d
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  csi:
    driver: test.csi.example.com
    volumeHandle: vol-%05d
`, i, i))
}

func benchPodYAML(i int, label string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: app-%05d
  labels:
    rev: %s
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: data-%05d
`, i, label, i)
}

func writeFile(tb testing.TB, dir, name, content string) {
	tb.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
}
