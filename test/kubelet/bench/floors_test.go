package bench_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// BenchmarkFloors prints what the steps every agent cannot avoid cost on
// this machine, now, so that a reader sees what is left above them: a GET
// of one object from kube-apiserver, an fsync of a small file, a durable
// record as csi-volmgr writes one (write, fsync, rename, fsync of the
// directory), a mkdir, and a bind mount with its unmount — each on the
// file system of the agents' root directories (os.TempDir). p50 and p99.
//
//	make bench-kubelet   (or: go test -run='^$' -bench=Floors -benchtime=1x ./bench/)
func BenchmarkFloors(b *testing.B) {
	fx := k8stest.New(b)
	client := fastClient(b, fx.Config)
	ctx := b.Context()
	size := resource.MustParse("1Mi")
	pvc, err := client.CoreV1().PersistentVolumeClaims(fx.Namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "floor"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kbfloor")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	for range b.N {
		rows := []struct {
			name, key string
			times     int
			fn        func(i int) error
		}{
			{"GET of one PVC from kube-apiserver", "floor_get", 500, func(int) error {
				_, err := client.CoreV1().PersistentVolumeClaims(fx.Namespace).Get(ctx, pvc.Name, metav1.GetOptions{})
				return err
			}},
			{"fsync of a 300-byte file", "floor_fsync", 100, func(i int) error { return writeFile(dir, i, false) }},
			{"durable record: write, fsync, rename, fsync dir", "floor_record", 100, func(i int) error { return writeFile(dir, i, true) }},
			{"mkdir", "floor_mkdir", 500, func(i int) error { return mkdir(dir, i) }},
			{"bind mount + unmount", "floor_mount", 100, func(i int) error { return bindMount(dir, i) }},
		}
		var out string
		for _, r := range rows {
			var ds []time.Duration
			for i := range r.times {
				began := time.Now()
				if err := r.fn(i); err != nil {
					b.Fatalf("%s: %v", r.name, err)
				}
				ds = append(ds, time.Since(began))
			}
			d := newDist(ds)
			out += fmt.Sprintf("\n  %-50s p50 %8.3f ms  p99 %8.3f ms  (%d times)", r.name, ms(d.q(.5)), ms(d.q(.99)), r.times)
			b.ReportMetric(ms(d.q(.5)), r.key+"_p50_ms")
			book.note("floor: %s: p50 %.3f ms, p99 %.3f ms", r.name, ms(d.q(.5)), ms(d.q(.99)))
		}
		details(b, "floors on this machine now (load "+loadAverage()+")", out)
	}
}

func writeFile(dir string, i int, record bool) error {
	path := filepath.Join(dir, fmt.Sprintf("r%d", i))
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(make([]byte, 300)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if !record {
		return os.Remove(tmp)
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func mkdir(dir string, i int) error {
	p := filepath.Join(dir, fmt.Sprintf("d%d", i))
	return os.Mkdir(p, 0o750) // removed with dir
}

func bindMount(dir string, i int) error {
	src, dst := filepath.Join(dir, fmt.Sprintf("src%d", i)), filepath.Join(dir, fmt.Sprintf("dst%d", i))
	for _, p := range []string{src, dst} {
		if err := os.Mkdir(p, 0o750); err != nil {
			return err
		}
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := unix.Unmount(dst, 0); err != nil {
		return err
	}
	_ = os.Remove(dst)
	return os.Remove(src)
}
