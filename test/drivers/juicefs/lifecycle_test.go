//go:build drivers

package juicefs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

const (
	appNamespace = "apps"
	pvName       = "juicefs-pv"
	volumeHandle = "juicefs-volume"
	secretName   = "juicefs-secret"
	// waitTimeout bounds each wait of the lifecycle.
	waitTimeout = 2 * time.Minute
)

// runLifecycle runs the agent with the JuiceFS node plugin on a real control plane and records
// each step in r.Lifecycle.
func runLifecycle(t *testing.T, r *driverresult.Result, bins string, fs *filesystem) {
	steps := &r.Lifecycle
	ctx := t.Context()
	node := "csi-volmgr-juicefs"

	// The control plane as kubeadm runs it: the Node authorizer and NodeRestriction hold the
	// agent, which authenticates as system:node:<node>, to its own Node's objects.
	env, err := k8stest.Start(k8stest.Options{NodeClientSigner: true, APIServerFlags: map[string][]string{
		"authorization-mode":       {"Node,RBAC"},
		"enable-admission-plugins": {"NodeRestriction"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	admin := env.Client
	dir := k8stest.KeptDir(t, "jl")
	adminKubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(adminKubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	kcm := process.New(process.Options{Name: "kube-controller-manager", Path: filepath.Join(k8sBinDir(t), "kube-controller-manager"),
		Args: []string{"--kubeconfig=" + adminKubeconfig, "--leader-elect=false", "--secure-port=0",
			"--controllers=persistentvolume-binder-controller,persistentvolume-attach-detach-controller"},
		LogFile: filepath.Join(dir, "kube-controller-manager.log"), ProcessGroup: true})
	if err := kcm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kcm.Close() })

	// The agent as its Node: a client certificate of system:node:<node> in its --cert-dir, as
	// --node-identity keeps it after the CSR flow (test/identity runs that flow itself).
	a, err := drivertest.AgentAsNode(t, env, node, 0, "--node-taints=")
	if err != nil {
		t.Fatal(err)
	}

	// The node plugin mounts below the agent's root, which its container shares Bidirectional.
	endpoint := filepath.Join(a.RootDir, "plugins", driverName, "csi.sock")
	if err := os.MkdirAll(filepath.Dir(endpoint), 0o755); err != nil {
		t.Fatal(err)
	}
	np := newNodePlugin(t, bins, dir, a.RootDir, endpoint, node, drivertest.FreePort(t))
	// The flags as a deployment writes them: the run's root directory and node name by the flags
	// of the agent they stand for.
	for _, f := range np.Flags {
		f = strings.ReplaceAll(f, a.RootDir, "<csi-volmgr --root-dir>")
		r.NodePluginFlags = append(r.NodePluginFlags, strings.ReplaceAll(f, node, "<csi-volmgr --node-name>"))
	}
	plug := process.New(process.Options{Name: "juicefs-node-plugin", Path: "/bin/sh", Args: []string{"-c", np.Command},
		LogFile: filepath.Join(dir, "node-plugin-process.log"), ProcessGroup: true,
		Ready: func(ctx context.Context, _ int) error { return waitForSocket(ctx, endpoint) }})
	t.Cleanup(func() {
		_ = plug.Close()
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "node-plugin.log")); err == nil {
				t.Logf("node plugin log, last 16 KiB:\n%s", tail(string(b), 16<<10))
			}
		}
	})
	if err := plug.Start(ctx); err != nil {
		t.Fatal(err)
	}
	startRegistrar(t, a.RegistrationDir, endpoint)

	if !step(t, steps, "agent (as its Node) registers the driver", func() error {
		if err := a.Start(ctx); err != nil {
			return err
		}
		return poll(ctx, func(ctx context.Context) (bool, error) {
			ds, err := a.Drivers(ctx)
			if err != nil {
				return false, nil
			}
			for _, d := range ds {
				if d.Name == driverName {
					csiNode, err := admin.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
					if err != nil {
						return false, nil
					}
					for _, cd := range csiNode.Spec.Drivers {
						if cd.Name == driverName && cd.NodeID == node {
							return true, nil
						}
					}
				}
			}
			return false, nil
		})
	}) {
		return
	}

	// The workload: the Secret, the CSIDriver as the chart installs it, a static PV (with
	// nodePublishSecretRef) and its claim, a pod on the agent's Node.
	objects(t, admin, fs)
	if !step(t, steps, "claim bound (static PV, nodePublishSecretRef)", func() error {
		return poll(ctx, func(ctx context.Context) (bool, error) {
			pvc, err := admin.CoreV1().PersistentVolumeClaims(appNamespace).Get(ctx, "data", metav1.GetOptions{})
			return err == nil && pvc.Status.Phase == corev1.ClaimBound, nil
		})
	}) {
		return
	}
	// Two pods of the claim, created at once, on a file system the node plugin has not formatted
	// yet: the agent publishes them one after the other, as the kubelet, for a driver without
	// STAGE_UNSTAGE_VOLUME.
	var pods []*corev1.Pod
	var targets []string
	for _, name := range []string{"app-0", "app-1"} {
		pod, err := admin.CoreV1().Pods(appNamespace).Create(ctx, appPod(name, node), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
		targets = append(targets, filepath.Join(a.RootDir, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", pvName, "mount"))
	}
	target := targets[0]
	if !step(t, steps, "two pods of the claim on the agent's Node: VolumesReady (the Secret read as the Node, one NodePublishVolume of the volume at a time)", func() error {
		for i, pod := range pods {
			if err := poll(ctx, func(ctx context.Context) (bool, error) {
				return drivertest.VolumesReady(ctx, admin, appNamespace, pod.Name)
			}); err != nil {
				return fmt.Errorf("%s: VolumesReady not True: %w", pod.Name, err)
			}
			fstype, err := mountType(targets[i])
			if err != nil {
				return err
			}
			if fstype != "fuse.juicefs" {
				return fmt.Errorf("%s's path %s is a %q mount, want fuse.juicefs", pod.Name, targets[i], fstype)
			}
		}
		return nil
	}) {
		return
	}
	if evs, err := admin.CoreV1().Events(appNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, ev := range evs.Items {
			if ev.Reason == "FailedMount" && strings.Contains(ev.Message, "format error") {
				r.Notes = append(r.Notes, fmt.Sprintf("In this run's lifecycle the publishes of the two pods met the driver's format race, which only parallel publishes cause "+
					"(a FailedMount Event on %s: %q); the agent published again with backoff and both pods became ready.", ev.InvolvedObject.Name, tail(ev.Message, 200)))
				break
			}
		}
	}

	reader := &juicefsReader{bin: filepath.Join(bins, "juicefs"), metaURL: fs.MetaURL, dir: filepath.Join(dir, "reader")}
	content := "written through the pod's path at " + time.Now().UTC().Format(time.RFC3339Nano)
	step(t, steps, "data written through the pod's path, read back through a separate juicefs mount", func() error {
		if err := os.WriteFile(filepath.Join(target, "hello.txt"), []byte(content), 0o644); err != nil {
			return err
		}
		return reader.expect(ctx, "hello.txt", content)
	})

	// The node plugin's container dies: every juicefs mount it ran dies with it
	// (kubernetes/kubernetes#96361), the pod's mount is left broken.
	step(t, steps, "node plugin killed while published: its juicefs processes gone, the pods' mounts dead (ENOTCONN)", func() error {
		if err := plug.Kill(); err != nil {
			return err
		}
		<-plug.Exited()
		// The kernel kills the rest of the PID namespace once its init, the plugin, is dead.
		if err := poll(ctx, func(context.Context) (bool, error) { return len(juicefsProcesses(bins)) == 0, nil }); err != nil {
			return fmt.Errorf("juicefs processes still running after the plugin's death: %v", juicefsProcesses(bins))
		}
		// ENOTCONN, or ECONNABORTED for a request the dead daemon had in flight.
		_, err := os.Stat(filepath.Join(target, "hello.txt"))
		if !errors.Is(err, syscall.ENOTCONN) && !errors.Is(err, syscall.ECONNABORTED) {
			return fmt.Errorf("stat of the pod's file after the plugin's death: %w, want ENOTCONN or ECONNABORTED", err)
		}
		return nil
	})
	step(t, steps, "node plugin restarted: the agent repairs both pods' mounts (NodeUnpublish, NodePublish), data intact", func() error {
		restarted := time.Now()
		if err := plug.Start(ctx); err != nil {
			return err
		}
		var last error
		err := poll(ctx, func(context.Context) (bool, error) {
			b, err := os.ReadFile(filepath.Join(target, "hello.txt"))
			last = err
			return err == nil && string(b) == content, nil
		})
		if err != nil {
			if last != nil {
				return fmt.Errorf("the pod's path did not serve the file again: %w (last read: %w)", err, last)
			}
			return fmt.Errorf("the pod's path did not serve the file again (with other content): %w", err)
		}
		for _, other := range targets[1:] {
			if err := poll(ctx, func(context.Context) (bool, error) {
				b, err := os.ReadFile(filepath.Join(other, "hello.txt"))
				return err == nil && string(b) == content, nil
			}); err != nil {
				return fmt.Errorf("the other pod's path %s did not serve the file again: %w", other, err)
			}
		}
		if evs, err := admin.CoreV1().Events(appNamespace).List(ctx, metav1.ListOptions{}); err == nil {
			for _, ev := range evs.Items {
				if ev.Reason == "FailedMount" && strings.Contains(ev.Message, "unpublishing the broken mount") && strings.Contains(ev.Message, "Could not unmount") {
					r.Notes = append(r.Notes, "In this run's repair a NodeUnpublishVolume of one pod's dead target failed (FailedMount Event: \"could not unmount ... not mounted\"): "+
						"driver defect — after its restart the plugin's own mount of the volume is gone, so the only other mount of the dead target's device is the other pod's target, "+
						"which NodeUnpublishVolume then unmounts as if it were its own mount of the volume (JUmount unmounts a single remaining reference). The agent published both again with backoff; both pods' paths work again (the step's time includes the retries).")
					break
				}
			}
		}
		r.Notes = append(r.Notes, fmt.Sprintf("After the node plugin's restart both pods' paths served their data again %.1f s after the plugin was started again (the agent's mount check on the driver's reconnection: NodeUnpublishVolume of each dead target, NodePublishVolume).", time.Since(restarted).Seconds()))
		after := "written after the repair"
		if err := os.WriteFile(filepath.Join(target, "after.txt"), []byte(after), 0o644); err != nil {
			return fmt.Errorf("writing after the repair: %w", err)
		}
		return reader.expect(ctx, "after.txt", after)
	})

	step(t, steps, "pods deleted: NodeUnpublishVolume, their deletion completed by the agent", func() error {
		for _, pod := range pods {
			if err := admin.CoreV1().Pods(appNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
				return err
			}
		}
		for _, pod := range pods {
			if err := poll(ctx, drivertest.PodGone(admin, appNamespace, pod.Name)); err != nil {
				return fmt.Errorf("%s not deleted: %w", pod.Name, err)
			}
		}
		return nil
	})
	step(t, steps, "nothing left mounted below the agent's root (the pods' targets)", func() error {
		mounts, err := agenttest.MountsBelow(a.RootDir)
		if err != nil {
			return err
		}
		if len(mounts) > 0 {
			return fmt.Errorf("mounted below the agent's root: %v", mounts)
		}
		return nil
	})
	// What the node plugin keeps for itself: its juicefs mount of the volume (MountBase) and the
	// juicefs process serving it, which it should release once no target uses the volume.
	step(t, steps, "the node plugin released its own mount of the volume: no juicefs mount in its namespace, no juicefs process", func() error {
		var problems []string
		for _, pid := range nsPIDs(plug.PID()) {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) > 4 && strings.Contains(line, "fuse.juicefs") {
					problems = append(problems, "still mounted in the plugin's namespace: "+f[4])
				}
			}
			break // one process's table is the namespace's
		}
		if pids := juicefsProcesses(bins); len(pids) > 0 {
			problems = append(problems, fmt.Sprintf("juicefs processes still running: %v", pids))
		}
		if len(problems) > 0 {
			return fmt.Errorf("%s. The plugin in process mode has no lock per volume: two NodePublishVolume calls of the volume "+
				"at once both find /var/lib/jfs/<volume> not mounted and each runs juicefs mount there, and NodeUnpublishVolume "+
				"releases only the top one; csi-volmgr runs them one at a time for a driver without STAGE_UNSTAGE_VOLUME, as the "+
				"kubelet (see the notes)", strings.Join(problems, "; "))
		}
		return nil
	})
}

// objects creates the workload's objects but the pod.
func objects(t *testing.T, c kubernetes.Interface, fs *filesystem) {
	ctx := t.Context()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Secrets(appNamespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName},
		StringData: fs.secrets()}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// deploy/k8s.yaml's CSIDriver.
	if _, err := c.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driverName},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false), PodInfoOnMount: ptr.To(false)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: volumeHandle, FSType: "juicefs",
				NodePublishSecretRef: &corev1.SecretReference{Namespace: appNamespace, Name: secretName},
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumeClaims(appNamespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr.To(""),
			VolumeName:       pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func appPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "app", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		},
	}
}

// juicefsReader reads the file system through juicefs's own client: a mount of its own, outside
// the node plugin, for each read.
type juicefsReader struct {
	bin, metaURL, dir string
}

func (j *juicefsReader) expect(ctx context.Context, name, want string) error {
	if err := os.MkdirAll(j.dir, 0o755); err != nil {
		return err
	}
	p := process.New(process.Options{Name: "juicefs-reader", Path: j.bin,
		Args:    []string{"mount", "--no-usage-report", "--cache-dir=" + filepath.Join(filepath.Dir(j.dir), "reader-cache"), j.metaURL, j.dir},
		LogFile: j.dir + ".log", ProcessGroup: true,
		Ready: func(ctx context.Context, _ int) error {
			return poll(ctx, func(context.Context) (bool, error) {
				var st syscall.Stat_t
				return syscall.Stat(j.dir, &st) == nil && st.Ino == 1, nil
			})
		}})
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("juicefs mount of the file system: %w (%s)", err, lastLine(p.TailLog(2048)))
	}
	defer func() {
		_, _ = runCmd(j.bin, "umount", j.dir)
		_ = p.Close()
	}()
	got, err := os.ReadFile(filepath.Join(j.dir, name))
	if err != nil {
		return fmt.Errorf("through juicefs's own mount: %w", err)
	}
	if string(got) != want {
		return fmt.Errorf("through juicefs's own mount %s holds %q, want %q", name, got, want)
	}
	return nil
}

// startRegistrar serves the plugin-registration socket of the driver in regDir, as
// node-driver-registrar does, until t ends; it keeps serving while the node plugin restarts.
func startRegistrar(t *testing.T, regDir, endpoint string) {
	sock := plugin.RegistrationSocket(regDir, driverName)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, plugin.NewRegistrationServer(driverName, endpoint))
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
}

func k8sBinDir(t *testing.T) string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..", "..", "bin", "k8s")
}

func poll(ctx context.Context, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, cond)
}

func waitForSocket(ctx context.Context, path string) error {
	return poll(ctx, func(context.Context) (bool, error) {
		c, err := net.Dial("unix", path)
		if err != nil {
			return false, nil
		}
		_ = c.Close()
		return true, nil
	})
}

// mountType is the file system type of the mount at path in this process's mount table.
func mountType(path string) (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	fstype := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[4] != path {
			continue
		}
		for i, x := range f {
			if x == "-" && i+1 < len(f) {
				fstype = f[i+1]
			}
		}
	}
	if fstype == "" {
		return "", fmt.Errorf("%s is not a mount point", path)
	}
	return fstype, nil
}

func isMountPoint(path string) (bool, error) {
	_, err := mountType(path)
	return err == nil, nil
}

// juicefsProcesses are the pids of processes running the juicefs client of bins (as juicefs or
// mount.juicefs).
func juicefsProcesses(bins string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || exe != filepath.Join(bins, "juicefs") {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// nsPIDs are pid and its descendants.
func nsPIDs(pid int) []int {
	if pid <= 0 {
		return nil
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", out[i], out[i]))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			var c int
			if _, err := fmt.Sscanf(f, "%d", &c); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
