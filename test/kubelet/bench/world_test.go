package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

const (
	// creators is how many goroutines create API objects and CSI volumes.
	creators = 16
	// creatorQPS is the client-side rate limit of the benchmark's own
	// clientset (not the agents', which keep their defaults).
	creatorQPS = 1000
	// volumeBytes is the size of each test-plugin volume.
	volumeBytes = 1 << 20
	// runTimeout bounds each wait for an agent (one pod published, every
	// volume torn down).
	runTimeout = 10 * time.Minute
	// benchLabel marks the PVs of one world, for their removal.
	benchLabel = "csi-volmgr.io/kubelet-bench"
)

// world is what both agents see, one after the other: one Node, the CSI
// test plugin (its registration socket waits in holdDir while no agent
// runs), the driver's CSIDriver and plugin volumes, each with a bound PVC
// and PV.
type world struct {
	fx      *k8stest.Fixture
	opts    worldOptions
	creator kubernetes.Interface
	plugin  *plugintest.Plugin
	driver  string
	holdDir string
	volumes []benchVolume
	journal *journalTail
	// proxy, when set, is the counting proxy the agents reach the API
	// server through instead of directly (agentAccess).
	proxy *countingProxy
}

// worldOptions says what a world holds.
type worldOptions struct {
	// driver is the CSI driver's name, unique per world (the CSIDriver
	// object is cluster-scoped).
	driver string
	// volumes is how many volumes (PVC and PV each) it holds.
	volumes int
	// attachRequired is the CSIDriver's attachRequired: the world then
	// plays the attach/detach controller and external-attacher (attach).
	attachRequired bool
	// accessMode is the PVCs' and PVs' access mode; empty means
	// ReadWriteOnce.
	accessMode corev1.PersistentVolumeAccessMode
}

// benchVolume is one test-plugin volume with its claim and PV.
type benchVolume struct {
	handle, claim, pv string
}

// newWorld builds a world.
func newWorld(ctx context.Context, tb testing.TB, o worldOptions) *world {
	tb.Helper()
	fx := k8stest.New(tb)
	fx.CreateNode(tb)
	driver := o.driver
	w := &world{fx: fx, opts: o, creator: fastClient(tb, fx.Config), driver: driver}

	var err error
	if w.holdDir, err = os.MkdirTemp("", "kbhold"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(w.holdDir) })
	// Verbosity 1: the plugin logs no request, so its log costs nothing.
	w.plugin = plugintest.Start(tb, plugintest.Options{
		Name: driver, NodeID: fx.NodeName, RegistrationDir: w.holdDir, Verbosity: 1, Dir: pluginDir(tb),
	})
	if w.journal, err = openJournalTail(w.plugin.JournalPath); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = w.journal.close() })

	attach := o.attachRequired
	if _, err := w.creator.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driver},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: &attach},
	}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("creating CSIDriver: %v", err)
	}
	tb.Cleanup(func() {
		_ = w.creator.StorageV1().CSIDrivers().Delete(context.WithoutCancel(ctx), driver, metav1.DeleteOptions{})
	})
	began := time.Now()
	w.createVolumes(ctx, tb, o.volumes)
	tb.Logf("setup: %d CSI volumes, PVCs and bound PVs created in %v", o.volumes, time.Since(began).Round(time.Millisecond))
	return w
}

// createVolumes creates n plugin volumes, and for each a PVC bound to a PV
// of the driver, as the PV controller (which envtest does not run) would.
func (w *world) createVolumes(ctx context.Context, tb testing.TB, n int) {
	tb.Helper()
	conn, err := w.plugin.Dial()
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	controller := csi.NewControllerClient(conn)
	mountCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	core := w.creator.CoreV1()
	ns := w.fx.Namespace
	mode := w.opts.accessMode
	if mode == "" {
		mode = corev1.ReadWriteOnce
	}
	w.volumes = make([]benchVolume, n)
	parallel(tb, n, func(i int) error {
		resp, err := controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name:               fmt.Sprintf("kbench-%05d", i),
			CapacityRange:      &csi.CapacityRange{RequiredBytes: volumeBytes},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap},
		})
		if err != nil {
			return fmt.Errorf("CreateVolume %d: %w", i, err)
		}
		v := benchVolume{handle: resp.GetVolume().GetVolumeId(), claim: fmt.Sprintf("claim-%05d", i), pv: fmt.Sprintf("%s-%05d", ns, i)}
		size := resource.MustParse("1Mi")
		c, err := core.PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: v.claim},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{mode},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
				VolumeName:  v.pv,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating PVC %s: %w", v.claim, err)
		}
		c.Status.Phase = corev1.ClaimBound
		c.Status.AccessModes = c.Spec.AccessModes
		c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
		if _, err := core.PersistentVolumeClaims(ns).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("binding PVC %s: %w", v.claim, err)
		}
		pv, err := core.PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: v.pv, Labels: map[string]string{benchLabel: ns}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
				AccessModes: []corev1.PersistentVolumeAccessMode{mode},
				ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
					Namespace: ns, Name: v.claim, UID: c.UID},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: w.driver, VolumeHandle: v.handle}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating PV %s: %w", v.pv, err)
		}
		pv.Status.Phase = corev1.VolumeBound
		if _, err := core.PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("binding PV %s: %w", v.pv, err)
		}
		w.volumes[i] = v
		return nil
	})
	tb.Cleanup(func() {
		// envtest runs no namespace controller: the claims stay unless
		// deleted here, and etcd would grow from benchmark to benchmark.
		ctx := context.WithoutCancel(ctx)
		_ = w.creator.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = w.creator.CoreV1().PersistentVolumes().DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: benchLabel + "=" + ns})
	})
}

// socketName is the base name of the plugin's registration socket.
func (w *world) socketName() string { return filepath.Base(w.plugin.RegistrationSocket) }

// moveSocket moves the plugin's registration socket from one directory to
// another: into an agent's registration directory, the agent finds and
// registers the driver as from a node-driver-registrar.
func (w *world) moveSocket(tb testing.TB, from, to string) {
	tb.Helper()
	if err := os.Rename(filepath.Join(from, w.socketName()), filepath.Join(to, w.socketName())); err != nil {
		tb.Fatalf("moving the registration socket: %v", err)
	}
}

// newPod is a pod on node whose one container mounts claim (the same pod
// as test/bench's).
func newPod(name, node, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "app", Image: "busybox",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}

// waitPublished waits until the agent published every volume of the world
// (a NodePublishVolume that began at or after since returned OK).
func (w *world) waitPublished(ctx context.Context, tb testing.TB, a *agent, since time.Time) {
	tb.Helper()
	waitFor(ctx, tb, 10*time.Millisecond, runTimeout, a.kind.name+" published every volume", func() (bool, error) {
		if _, err := w.journal.poll(); err != nil {
			return false, err
		}
		for _, v := range w.volumes {
			if !w.journal.lastOK(v.handle, "NodePublishVolume", since) {
				return false, nil
			}
		}
		return true, nil
	})
}

// deletePods deletes every pod of the world's namespace (grace period 0,
// as after the containers stopped) and waits until the agent unstaged the
// first n volumes and nothing is mounted below its root directory. It
// returns how long that took.
func (w *world) deletePods(ctx context.Context, tb testing.TB, a *agent, n int) time.Duration {
	tb.Helper()
	began := time.Now()
	w.deleteAllPods(ctx, tb)
	want := map[string]bool{}
	for _, v := range w.volumes[:n] {
		want[v.handle] = true
	}
	waitFor(ctx, tb, 100*time.Millisecond, runTimeout, fmt.Sprintf("%s tore down %d volumes", a.kind.name, n), func() (bool, error) {
		if _, err := w.journal.poll(); err != nil {
			return false, err
		}
		for h := range want {
			if w.journal.lastOK(h, "NodeUnstageVolume", began) {
				delete(want, h)
			}
		}
		return len(want) == 0 && len(mountsBelow(tb, a.root)) == 0, nil
	})
	return time.Since(began)
}

// Helpers.

// waitFor polls cond every interval until it holds, and fails b after
// timeout.
func waitFor(ctx context.Context, tb testing.TB, interval, timeout time.Duration, what string, cond func() (bool, error)) {
	tb.Helper()
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true,
		func(context.Context) (bool, error) { return cond() })
	if err != nil {
		tb.Fatalf("waiting for %s: %v", what, err)
	}
}

// parallel runs fn(0..n-1) on `creators` goroutines and fails b on the
// first error.
func parallel(tb testing.TB, n int, fn func(i int) error) {
	tb.Helper()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range creators {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				mu.Lock()
				stop := i >= n || first != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		tb.Fatal(first)
	}
}

// fastClient is a clientset for the benchmark's own writes, whose rate
// limit it never reaches.
func fastClient(tb testing.TB, cfg *rest.Config) kubernetes.Interface {
	tb.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = creatorQPS, 2*creatorQPS
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return client
}

// pluginDir returns a directory on a fresh tmpfs for the plugin's socket,
// state, journal and volumes, unmounted and removed when b ends: the test
// plugin rewrites its state file with fsync on every stage and publish,
// which on a disk would make the plugin, not the agent, the bottleneck
// (test/bench does the same). The agents' root directories stay on the
// disk: their records are their own cost.
func pluginDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "kbp")
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1g,mode=0750"); err != nil {
		tb.Fatalf("mounting a tmpfs for the plugin: %v", err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			tb.Errorf("unmounting the plugin's tmpfs: %v", err)
			return
		}
		if err := os.Remove(dir); err != nil {
			tb.Errorf("removing %s: %v", dir, err)
		}
	})
	return dir
}

// mountsBelow lists the mount points at or below dir.
func mountsBelow(tb testing.TB, dir string) []string {
	tb.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		tb.Fatalf("reading the mount table: %v", err)
	}
	var out []string
	for _, mi := range infos {
		if mi.MountPoint == dir || strings.HasPrefix(mi.MountPoint, dir+"/") {
			out = append(out, mi.MountPoint)
		}
	}
	return out
}

// removeUnmounted removes dir unless something is still mounted below it.
func removeUnmounted(tb testing.TB, dir string) {
	tb.Helper()
	if left := mountsBelow(tb, dir); len(left) > 0 {
		tb.Errorf("%d mounts left below %s, not removing it; e.g. %s", len(left), dir, left[0])
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		tb.Errorf("removing %s: %v", dir, err)
	}
}

// deleteAllPods deletes every pod of the world at once (grace period 0).
// A loaded API server may answer a collection delete of thousands of pods
// with a timeout while it goes on deleting: the delete is then sent again.
func (w *world) deleteAllPods(ctx context.Context, tb testing.TB) {
	tb.Helper()
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := w.creator.CoreV1().Pods(w.fx.Namespace).DeleteCollection(ctx,
			metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
		if apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) {
			tb.Logf("deleting pods: %v; sending the delete again", err)
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		tb.Fatalf("deleting pods: %v", err)
	}
}
