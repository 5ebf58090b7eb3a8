//go:build e2e

package cluster_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/gobuild"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/test/process"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// Driver names of the two CSI test plugins: one whose volumes the
// attach/detach controller and the external-attacher attach, one that
// needs no attach.
const (
	attachDriver   = "attach.e2e.csi-volmgr.io"
	noAttachDriver = "noattach.e2e.csi-volmgr.io"
	// staticClass is the StorageClass of pre-created PVs (no provisioner).
	staticClass = "e2e-static"
	// taintKey is the example runtime's taint (examples/vk-runtime).
	taintKey = "csi-volmgr.io/example-runtime"
	timeout  = 3 * time.Minute
)

var exampleRuntime = &gobuild.Binary{
	Package:     "github.com/csi-volmgr/csi-volmgr/examples/vk-runtime",
	Name:        "csi-volmgr-example-runtime",
	EnvOverride: "CSI_VOLMGR_EXAMPLE_RUNTIME",
}

// cluster is a control plane, two CSI test plugins, the external-attacher
// and the example runtime with its virtual Node.
type cluster struct {
	t          testing.TB
	client     kubernetes.Interface
	dir        string
	kubeconfig string
	node       string
	namespace  string
	attach     *plugintest.Plugin
	noAttach   *plugintest.Plugin
	runtime    *process.Process
	// agentHTTP is the embedded csi-volmgr's HTTP endpoint; agentSocket
	// its API socket, which serves the JSON API without credentials.
	agentHTTP, agentSocket string
	// kubeletAPI is the runtime's kubelet endpoint (HTTPS, /stats/summary).
	kubeletAPI string
}

// startCluster starts everything and waits until the virtual Node is
// Ready; runtimeArgs are more flags of the example runtime.
func startCluster(t testing.TB, runtimeArgs ...string) *cluster {
	t.Helper()
	env, err := k8stest.Start(k8stest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	dir, err := os.MkdirTemp("", "e2e")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, client: env.Client, dir: dir, kubeconfig: filepath.Join(dir, "kubeconfig"),
		node: "virtual-" + k8stest.UniqueName("n"), namespace: "e2e"}
	root, state := filepath.Join(dir, "root"), filepath.Join(dir, "state")
	regDir := filepath.Join(root, "plugins_registry")
	for _, d := range []string{regDir, state} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if mps := mountsUnder(t, dir); len(mps) > 0 {
			t.Errorf("mounts left under %s: %v (directory kept)", dir, mps)
			return
		}
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	if err := os.WriteFile(c.kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, attach := range map[string]bool{attachDriver: true, noAttachDriver: false} {
		spec := storagev1.CSIDriverSpec{AttachRequired: ptr.To(attach)}
		if !attach {
			// The driver without attach serves CSI inline volumes too
			// (podInfoOnMount: the plugin learns from the volume context
			// that a publish is of an inline volume).
			spec.PodInfoOnMount = ptr.To(true)
			spec.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{
				storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}
		}
		if _, err := c.client.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: staticClass},
		Provisioner: "kubernetes.io/no-provisioner",
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	bins := binDir(t)
	startProc(t, dir, "kube-controller-manager", filepath.Join(bins, "kube-controller-manager"),
		"--kubeconfig="+c.kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers=persistentvolume-binder-controller,persistentvolume-attach-detach-controller,ephemeral-volume-controller,"+
			"persistentvolume-protection-controller,persistentvolumeclaim-protection-controller,node-lifecycle-controller",
		"--kube-api-qps=100", "--kube-api-burst=200", "--concurrent-ephemeralvolume-syncs=10")
	startProc(t, dir, "kube-scheduler", filepath.Join(bins, "kube-scheduler"),
		"--kubeconfig="+c.kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--kube-api-qps=100", "--kube-api-burst=200", "-v=2")

	// The plugins start before the runtime: they are there when its
	// agent looks at the registration directory.
	c.attach = plugintest.Start(t, plugintest.Options{Name: attachDriver, RegistrationDir: regDir,
		Capabilities: &plugin.Capabilities{StageUnstage: true, ControllerPublish: true, VolumeStats: true}, Verbosity: 2})
	c.noAttach = plugintest.Start(t, plugintest.Options{Name: noAttachDriver, RegistrationDir: regDir,
		Capabilities: &plugin.Capabilities{StageUnstage: true, VolumeStats: true}, Verbosity: 2})
	startProc(t, dir, "csi-attacher", filepath.Join(bins, "csi-attacher"),
		"--csi-address="+c.attach.Endpoint, "--kubeconfig="+c.kubeconfig, "--leader-election=false",
		"--timeout=30s", "--worker-threads=20", "--kube-api-qps=100", "--kube-api-burst=200")

	rt, err := exampleRuntime.Path()
	if err != nil {
		t.Fatal(err)
	}
	c.agentHTTP = "127.0.0.1:" + freePort(t)
	c.agentSocket = volumemanager.SocketPath(root)
	kubeletPort := freePort(t)
	c.kubeletAPI = "127.0.0.1:" + kubeletPort
	c.runtime = startProc(t, dir, "example-runtime", rt, append([]string{
		"--kubeconfig=" + c.kubeconfig, "--node-name=" + c.node, "--root-dir=" + root, "--state-dir=" + state,
		"--http-endpoint=" + c.agentHTTP, "--workers=20", "--kubelet-port=" + kubeletPort,
	}, runtimeArgs...)...)
	c.waitFor("the virtual Node to be Ready", func(ctx context.Context) (bool, error) {
		n, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	// Both drivers registered: the CSINode lists them.
	c.waitFor("both drivers in the CSINode", func(ctx context.Context) (bool, error) {
		cn, err := c.client.StorageV1().CSINodes().Get(ctx, c.node, metav1.GetOptions{})
		return err == nil && len(cn.Spec.Drivers) == 2, nil
	})
	return c
}

// waitFor polls cond until it holds, failing the test after timeout.
func (c *cluster) waitFor(what string, cond wait.ConditionWithContextFunc) {
	c.t.Helper()
	if err := wait.PollUntilContextTimeout(c.t.Context(), 50*time.Millisecond, timeout, true, cond); err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// staticVolume creates a filesystem volume on p and a PV for it of class
// (no claimRef: the PV controller binds it).
func (c *cluster) staticVolume(p *plugintest.Plugin, pvName, class string) (handle string) {
	c.t.Helper()
	return c.staticVolumeOf(p, pvName, class, corev1.PersistentVolumeFilesystem)
}

// staticVolumeOf is staticVolume for either volume mode.
func (c *cluster) staticVolumeOf(p *plugintest.Plugin, pvName, class string, mode corev1.PersistentVolumeMode) (handle string) {
	c.t.Helper()
	capability := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}
	if mode == corev1.PersistentVolumeBlock {
		capability.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	}
	capability.AccessMode = &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	conn, err := p.Dial()
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewControllerClient(conn).CreateVolume(c.t.Context(), &csi.CreateVolumeRequest{
		Name:               pvName,
		VolumeCapabilities: []*csi.VolumeCapability{capability},
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 1 << 30},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	handle = resp.GetVolume().GetVolumeId()
	if _, err := c.client.CoreV1().PersistentVolumes().Create(c.t.Context(), &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: class,
			VolumeMode:       &mode,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: p.Name, VolumeHandle: handle,
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	return handle
}

// claim creates a PVC of class asking for 1Gi, of the given volume mode
// (default filesystem).
func (c *cluster) claim(name, class string, mode ...corev1.PersistentVolumeMode) {
	c.t.Helper()
	c.claimOf(name, class, "", mode...)
}

// claimOf is claim for the PV pvName alone (spec.volumeName), when several
// PVs of the class would fit it; empty binds any.
func (c *cluster) claimOf(name, class, pvName string, mode ...corev1.PersistentVolumeMode) {
	c.t.Helper()
	spec := claimSpec(class)
	spec.VolumeName = pvName
	if len(mode) > 0 {
		spec.VolumeMode = &mode[0]
	}
	if _, err := c.client.CoreV1().PersistentVolumeClaims(c.namespace).Create(c.t.Context(), &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace},
		Spec:       spec,
	}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func claimSpec(class string) corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		StorageClassName: ptr.To(class),
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}
}

// pod returns a pod for the virtual node (toleration, no node name: the
// scheduler places it) running command with the given volumes mounted at
// /<volume name>.
func (c *cluster) pod(name string, command string, volumes ...corev1.Volume) *corev1.Pod {
	ctr := corev1.Container{
		Name: "main", Image: "none", Command: []string{"sh", "-c", command},
		Env: []corev1.EnvVar{{Name: "E2E_POD", Value: c.namespace + "/" + name}},
	}
	for _, v := range volumes {
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.namespace},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{ctr},
			Volumes:                       volumes,
			Tolerations:                   []corev1.Toleration{{Key: taintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: ptr.To[int64](10),
		},
	}
}

func claimVolume(name, claim string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

// inlineVolume is a CSI inline (ephemeral) volume of driver.
func inlineVolume(name, driver string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: driver}}}
}

func ephemeralVolume(name, class string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{
		VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: claimSpec(class)},
	}}}
}

func mountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	mps, err := mount.New("").List()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mp := range mps {
		if mp.Path == dir || strings.HasPrefix(mp.Path, dir+"/") {
			out = append(out, mp.Path)
		}
	}
	return out
}
