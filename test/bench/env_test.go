package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

const (
	// defaultPods is the number of pods, each with its own PVC and PV,
	// unless EnvPods says otherwise.
	defaultPods = 1000
	// creators is how many goroutines create API objects and CSI volumes.
	creators = 16
	// creatorQPS is the client-side rate limit of the benchmark's own
	// clientset (not the agent's, which keeps the `run` defaults).
	creatorQPS = 1000
	// volumeBytes is the size of each test-plugin volume.
	volumeBytes = 1 << 20
	// runTimeout bounds each wait for the agent (all pods ready, all
	// volumes torn down).
	runTimeout = 5 * time.Minute
	// benchLabel marks the PVs of one benchmark, for their removal.
	benchLabel = "csi-volmgr.io/bench"
)

// EnvPods names an environment variable that overrides the number of pods
// (default 1000), for quick trial runs; the figures are for 1000.
const EnvPods = "CSI_VOLMGR_BENCH_PODS"

// benchPods is the number of pods: defaultPods, or EnvPods.
var benchPods = func() int {
	if n, err := strconv.Atoi(os.Getenv(EnvPods)); err == nil && n > 0 {
		return n
	}
	return defaultPods
}()

// envOptions configures a benchEnv.
type envOptions struct {
	// driver is the CSI driver name, unique per benchmark (the CSIDriver
	// object is cluster-scoped).
	driver string
	// registered makes the plugin register with the agent from the start;
	// otherwise its registration socket waits outside the registration
	// directory until register.
	registered bool
	// clusterWide runs the agent with cluster-wide PVC, PV and
	// VolumeAttachment informers instead of by-name watches.
	clusterWide bool
}

// benchEnv is one benchmark's world: a Node, the test plugin with
// benchPods volumes, their bound PVCs and PVs, the driver's CSIDriver
// (attachRequired=false, so no VolumeAttachment is involved) and the agent.
type benchEnv struct {
	fx      *k8stest.Fixture
	opts    envOptions
	creator kubernetes.Interface
	plugin  *plugintest.Plugin
	// csi is a connection of the benchmark's own to the plugin.
	csi *csiclient.Client
	// root is the agent's root directory; regDir its registration
	// directory; holdDir where the registration socket waits.
	root, regDir, holdDir string
	volumes               []benchVolume
	agent                 *agent
	// driverEvents receives the registry's events for the driver.
	driverEvents chan driverEvent
}

// benchVolume is one test-plugin volume with its claim.
type benchVolume struct {
	handle, claim, pv string
}

type driverEvent struct {
	typ registry.EventType
	at  time.Time
}

func newBenchEnv(ctx context.Context, b *testing.B, fx *k8stest.Fixture, o envOptions) *benchEnv {
	b.Helper()
	fx.CreateNode(b)
	e := &benchEnv{fx: fx, opts: o, creator: fastClient(b, fx.Config), driverEvents: make(chan driverEvent, 16)}

	// Created before the plugin so that it is removed after the plugin
	// unmounted everything (cleanups run last-in first-out).
	var err error
	if e.root, err = os.MkdirTemp("", "bench"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { removeUnmounted(b, e.root) })
	e.regDir, e.holdDir = filepath.Join(e.root, "plugins_registry"), filepath.Join(e.root, "hold")
	for _, d := range []string{e.regDir, e.holdDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			b.Fatal(err)
		}
	}

	sockDir := e.holdDir
	if o.registered {
		sockDir = e.regDir
	}
	// Verbosity 1: the plugin logs no request, so its log costs nothing.
	e.plugin = plugintest.Start(b, plugintest.Options{
		Name: o.driver, NodeID: fx.NodeName, RegistrationDir: sockDir, Verbosity: 1, Dir: pluginDir(b),
	})
	if e.csi, err = csiclient.New(ctx, csiclient.Config{DriverName: o.driver, Endpoint: e.plugin.Endpoint}); err != nil {
		b.Fatalf("connecting to the plugin: %v", err)
	}
	b.Cleanup(func() { _ = e.csi.Close() })

	attach := false
	if _, err := e.creator.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: o.driver},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: &attach},
	}, metav1.CreateOptions{}); err != nil {
		b.Fatalf("creating CSIDriver: %v", err)
	}
	b.Cleanup(func() {
		_ = e.creator.StorageV1().CSIDrivers().Delete(context.WithoutCancel(ctx), o.driver, metav1.DeleteOptions{})
	})

	began := time.Now()
	e.createVolumes(ctx, b)
	b.Logf("setup: %d CSI volumes, PVCs and bound PVs created in %v", benchPods, time.Since(began).Round(time.Millisecond))

	e.agent = startAgent(ctx, b, agentConfig{
		rest: fx.Config, nodeName: fx.NodeName, rootDir: e.root, regDir: e.regDir, clusterWide: o.clusterWide,
		onDriver: func(ev registry.Event) {
			if ev.Driver == o.driver {
				e.driverEvents <- driverEvent{typ: ev.Type, at: time.Now()}
			}
		},
	})
	if o.registered {
		e.waitDriver(ctx, b, registry.Registered)
	}
	return e
}

// createVolumes creates benchPods plugin volumes, and for each a PVC bound
// to a PV of the driver.
func (e *benchEnv) createVolumes(ctx context.Context, b *testing.B) {
	b.Helper()
	e.volumes = make([]benchVolume, benchPods)
	mountCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	core := e.creator.CoreV1()
	ns := e.fx.Namespace
	parallel(b, benchPods, func(i int) error {
		resp, err := e.csi.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name:               fmt.Sprintf("bench-%04d", i),
			CapacityRange:      &csi.CapacityRange{RequiredBytes: volumeBytes},
			VolumeCapabilities: []*csi.VolumeCapability{mountCap},
		})
		if err != nil {
			return fmt.Errorf("CreateVolume %d: %w", i, err)
		}
		v := benchVolume{handle: resp.GetVolume().GetVolumeId(), claim: fmt.Sprintf("claim-%04d", i), pv: fmt.Sprintf("%s-%04d", ns, i)}
		size := resource.MustParse("1Mi")
		c, err := core.PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: v.claim},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
				VolumeName:  v.pv,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating PVC %s: %w", v.claim, err)
		}
		// Bound, as the PV controller (which envtest does not run) would.
		c.Status.Phase = corev1.ClaimBound
		c.Status.AccessModes = c.Spec.AccessModes
		c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
		if _, err := core.PersistentVolumeClaims(ns).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("binding PVC %s: %w", v.claim, err)
		}
		if _, err := core.PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: v.pv, Labels: map[string]string{benchLabel: ns}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
					Namespace: ns, Name: v.claim, UID: c.UID},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: e.opts.driver, VolumeHandle: v.handle}},
			},
		}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating PV %s: %w", v.pv, err)
		}
		e.volumes[i] = v
		return nil
	})
	b.Cleanup(func() {
		_ = e.creator.CoreV1().PersistentVolumes().DeleteCollection(context.WithoutCancel(ctx), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: benchLabel + "=" + ns})
	})
}

// benchPod is one pod the benchmark created.
type benchPod struct {
	uid    types.UID
	volume benchVolume
}

// createPods creates one pod per volume, named <prefix>-<i>, with
// `creators` goroutines, as fast as the API server takes them.
func (e *benchEnv) createPods(ctx context.Context, b *testing.B, prefix string) []benchPod {
	b.Helper()
	pods := make([]benchPod, len(e.volumes))
	parallel(b, len(e.volumes), func(i int) error {
		v := e.volumes[i]
		p, err := e.creator.CoreV1().Pods(e.fx.Namespace).Create(ctx, newPod(fmt.Sprintf("%s-%04d", prefix, i), e.fx.NodeName, v.claim), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating pod %d: %w", i, err)
		}
		pods[i] = benchPod{uid: p.UID, volume: v}
		return nil
	})
	return pods
}

// waitReady waits until n more pods became ready in the agent and returns
// their ReadyObserver observations.
func (e *benchEnv) waitReady(ctx context.Context, b *testing.B, n int) []readyObservation {
	b.Helper()
	waitFor(ctx, b, 2*time.Millisecond, runTimeout, fmt.Sprintf("%d pods ready", n), func() (bool, error) {
		return e.agent.probe.count() >= n, nil
	})
	obs := e.agent.probe.take()
	if len(obs) != n {
		b.Fatalf("%d pods became ready, want %d", len(obs), n)
	}
	return obs
}

// deletePods deletes the benchmark's pods and waits until the agent holds
// no volume any more (all unpublished and unstaged) and nothing is mounted
// below its root directory.
func (e *benchEnv) deletePods(ctx context.Context, b *testing.B) time.Duration {
	b.Helper()
	began := time.Now()
	if err := e.creator.CoreV1().Pods(e.fx.Namespace).DeleteCollection(ctx,
		metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		b.Fatalf("deleting pods: %v", err)
	}
	// Snapshot copies the whole actual state: poll it gently.
	waitFor(ctx, b, 100*time.Millisecond, runTimeout, "every volume torn down", func() (bool, error) {
		return len(e.agent.vm.Volumes()) == 0, nil
	})
	took := time.Since(began)
	if left := mountsBelow(b, e.root); len(left) > 0 {
		b.Fatalf("%d mounts left below %s after teardown, e.g. %s", len(left), e.root, left[0])
	}
	return took
}

// register moves the plugin's registration socket into the agent's
// registration directory and returns when the agent registered the driver;
// unregister moves it back out and returns when the agent dropped it.
func (e *benchEnv) register(ctx context.Context, b *testing.B) time.Time {
	b.Helper()
	e.moveSocket(b, e.holdDir, e.regDir)
	return e.waitDriver(ctx, b, registry.Registered)
}

func (e *benchEnv) unregister(ctx context.Context, b *testing.B) {
	b.Helper()
	e.moveSocket(b, e.regDir, e.holdDir)
	e.waitDriver(ctx, b, registry.Deregistered)
}

func (e *benchEnv) moveSocket(b *testing.B, from, to string) {
	b.Helper()
	name := filepath.Base(e.plugin.RegistrationSocket)
	if err := os.Rename(filepath.Join(from, name), filepath.Join(to, name)); err != nil {
		b.Fatalf("moving the registration socket: %v", err)
	}
}

// waitDriver waits for the registry's next event of the driver, which must
// be typ, and returns when it happened.
func (e *benchEnv) waitDriver(ctx context.Context, b *testing.B, typ registry.EventType) time.Time {
	b.Helper()
	select {
	case ev := <-e.driverEvents:
		if ev.typ != typ {
			b.Fatalf("driver event %v, want %v", ev.typ, typ)
		}
		return ev.at
	case <-time.After(time.Minute):
		b.Fatalf("no driver event %v within a minute", typ)
	case <-ctx.Done():
		b.Fatal(ctx.Err())
	}
	return time.Time{}
}

// calls returns the plugin's calls of method that began at or after since.
func (e *benchEnv) calls(b *testing.B, since time.Time, methods ...string) []plugin.Call {
	b.Helper()
	entries, err := e.plugin.ReadJournal()
	if err != nil {
		b.Fatalf("reading the plugin journal: %v", err)
	}
	var out []plugin.Call
	for _, c := range plugin.Calls(entries) {
		if c.Begin.Time.Before(since) {
			continue
		}
		for _, m := range methods {
			if c.Begin.Method == m {
				out = append(out, c)
			}
		}
	}
	return out
}

// Helpers.

// waitFor polls cond every interval until it holds, and fails b after
// timeout.
func waitFor(ctx context.Context, b *testing.B, interval, timeout time.Duration, what string, cond func() (bool, error)) {
	b.Helper()
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true,
		func(context.Context) (bool, error) { return cond() })
	if err != nil {
		b.Fatalf("waiting for %s: %v", what, err)
	}
}

// parallel runs fn(0..n-1) on `creators` goroutines and fails b on the
// first error.
func parallel(b *testing.B, n int, fn func(i int) error) {
	b.Helper()
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
				if i >= n {
					return
				}
				mu.Lock()
				failed := first != nil
				mu.Unlock()
				if failed {
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
		b.Fatal(first)
	}
}

// fastClient is a clientset for the benchmark's own writes without the
// default client-side rate limit (5 QPS).
func fastClient(b *testing.B, cfg *rest.Config) kubernetes.Interface {
	b.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = creatorQPS, 2*creatorQPS
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return client
}

// pluginDir returns a directory on a fresh tmpfs for the plugin's socket,
// state, journal and volumes, unmounted and removed when b ends.
//
// The test plugin rewrites its whole state file (every volume) with fsync
// under one lock on every stage and publish. On a disk that makes the
// plugin, not the agent, the bottleneck of 2,000 calls, and the agent's own
// fsyncs would slow the plugin down through the shared disk; neither is
// part of "a zero-delay plugin" or "a 10 ms plugin". The agent's root
// directory stays on the disk: its durable records are its own cost.
func pluginDir(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("", "bp")
	if err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1g,mode=0750"); err != nil {
		b.Fatalf("mounting a tmpfs for the plugin: %v", err)
	}
	// Registered before the plugin's Close, so it runs after it.
	b.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			b.Errorf("unmounting the plugin's tmpfs: %v", err)
			return
		}
		if err := os.Remove(dir); err != nil {
			b.Errorf("removing %s: %v", dir, err)
		}
	})
	return dir
}

// mountsBelow lists the mount points at or below dir.
func mountsBelow(b *testing.B, dir string) []string {
	b.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		b.Fatalf("reading the mount table: %v", err)
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
func removeUnmounted(b *testing.B, dir string) {
	b.Helper()
	if left := mountsBelow(b, dir); len(left) > 0 {
		b.Errorf("%d mounts left below %s, not removing it; e.g. %s", len(left), dir, left[0])
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		b.Errorf("removing %s: %v", dir, err)
	}
}
