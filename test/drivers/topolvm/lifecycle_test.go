//go:build drivers

package topolvm_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/mount-utils"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	"github.com/csi-volmgr/csi-volmgr/test/process"
)

const (
	appNamespace = "app"
	topologyKey  = "topology.topolvm.io/node"
	volumeSize   = "512Mi"
)

var logicalVolumes = schema.GroupVersionResource{Group: "topolvm.io", Version: "v1", Resource: "logicalvolumes"}

// volume is one of the lifecycle's claims: fs (volumeMode Filesystem, ext4) or blk (Block).
type volume struct {
	name     string
	block    bool
	lvName   string // the LV in the volume group: status.volumeID of its LogicalVolume
	pod      *corev1.Pod
	path     string // the pod's path: the mount, or the block device
	data     []byte
	mountDev uint64
}

// lifecycle is one run of the agent with the driver.
type lifecycle struct {
	t      *testing.T
	m      *matrix
	node   string
	agent  *agenttest.Agent
	driver *process.Process
	vols   []*volume
}

func runLifecycle(t *testing.T, rec *drivertest.Recorder, m *matrix) {
	l := &lifecycle{t: t, m: m, node: "topolvm-agent-" + fmt.Sprint(time.Now().UnixNano()%1000000),
		vols: []*volume{{name: "fs"}, {name: "blk", block: true}}}
	rec.Step("node plugin registered with the agent acting as its Node", l.start)
	rec.Step("LogicalVolumes of the Node (fs, block) created by topolvm-node in the volume group", l.createVolumes)
	rec.Step("static PVs (ext4; volumeMode Block) of the LVs bound to their claims", l.bind)
	rec.Step("pods of the claims on the agent's Node: VolumesReady", l.podsReady)
	rec.Step("data written through the pods' paths read back from the LVs with LVM's own device (debugfs; dd)", l.dataThrough)
	rec.Step("node plugin SIGKILLed and restarted while published: the mounts and data stay, VolumesReady stays", l.driverRestart)
	rec.Step("pods deleted: unpublished, unstaged, nothing left mounted below the agent's root, no symlink or loop device left", l.teardown)
	rec.Step("LogicalVolumes deleted: topolvm-node removes the LVs from the volume group", l.removeVolumes)
}

func (l *lifecycle) start() error {
	t, m := l.t, l.m
	ctx := t.Context()
	kcm := drivertest.StartProc(t, m.dir, "kube-controller-manager", drivertest.K8sBin(t, "kube-controller-manager"), nil,
		"--kubeconfig="+m.kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers=persistentvolume-binder-controller")
	_ = kcm
	a, err := drivertest.AgentAsNode(t, m.env, l.node, 4, "--node-taints=")
	if err != nil {
		return err
	}
	l.agent = a
	sock := filepath.Join(l.agent.RootDir, "plugins", driverName, "node", "csi-topolvm.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		return err
	}
	drivertest.ServeRegistration(t, l.agent.RegistrationDir, driverName, sock)
	if err := l.agent.Start(ctx); err != nil {
		return err
	}
	// topolvm-node exits when its Node does not exist ("Node ... not found"): a DaemonSet pod
	// starts on a registered Node, here the one the agent registers.
	if err := l.poll("the Node registered by the agent", func(ctx context.Context) (bool, error) {
		_, err := m.env.Client.CoreV1().Nodes().Get(ctx, l.node, metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return err
	}
	env := append([]string{"NODE_NAME=" + l.node}, m.nodeEnv()[1:]...)
	l.driver = drivertest.StartProc(t, m.dir, "topolvm-node", drivertest.Binary(t, binDir, "hypertopolvm"), env,
		nodeFlags(sock, m.lvmdConfig)...)
	return l.poll("the driver in the Node's CSINode", drivertest.DriverInCSINode(m.env.Client, l.node, driverName, l.node))
}

// createVolumes creates the LogicalVolumes as topolvm-controller's CreateVolume does, on the
// agent's Node, and waits for topolvm-node to create their LVs (status.volumeID).
func (l *lifecycle) createVolumes() error {
	ctx := l.t.Context()
	dyn := drivertest.NewApplier(l.t, l.m.env.Config).Dyn
	for _, v := range l.vols {
		lv := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
			"metadata": map[string]any{"name": l.node + "-" + v.name},
			"spec": map[string]any{"name": l.node + "-" + v.name, "nodeName": l.node, "size": volumeSize,
				"deviceClass": deviceClass},
		}}
		if _, err := dyn.Resource(logicalVolumes).Create(ctx, lv, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, v := range l.vols {
		if err := l.poll("status.volumeID of the LogicalVolume "+v.name, func(ctx context.Context) (bool, error) {
			got, err := dyn.Resource(logicalVolumes).Get(ctx, l.node+"-"+v.name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			v.lvName, _, _ = unstructured.NestedString(got.Object, "status", "volumeID")
			if msg, _, _ := unstructured.NestedString(got.Object, "status", "message"); v.lvName == "" && msg != "" {
				return false, fmt.Errorf("topolvm-node: %s", msg)
			}
			return v.lvName != "", nil
		}); err != nil {
			return err
		}
		if _, err := os.Stat(l.lvDevice(v)); err != nil {
			return fmt.Errorf("the LV of %s: %w", v.name, err)
		}
	}
	return nil
}

// lvDevice is the LV's device as LVM itself names it.
func (l *lifecycle) lvDevice(v *volume) string { return filepath.Join("/dev", l.m.vg, v.lvName) }

func (l *lifecycle) bind() error {
	ctx := l.t.Context()
	c := l.m.env.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, v := range l.vols {
		mode := corev1.PersistentVolumeFilesystem
		fsType := "ext4"
		if v.block {
			mode, fsType = corev1.PersistentVolumeBlock, ""
		}
		pvName := l.node + "-" + v.name
		if _, err := c.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: pvName},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				VolumeMode:                    &mode,
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: driverName, VolumeHandle: v.lvName, FSType: fsType,
					VolumeAttributes: map[string]string{"topolvm.io/device-class": deviceClass},
				}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: topologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{l.node}}},
				}}}},
			},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := c.CoreV1().PersistentVolumeClaims(appNamespace).Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: v.name},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(""),
				VolumeName:       pvName,
				VolumeMode:       &mode,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(volumeSize)}},
			},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, v := range l.vols {
		if err := l.poll("the claim "+v.name+" bound", func(ctx context.Context) (bool, error) {
			pvc, err := c.CoreV1().PersistentVolumeClaims(appNamespace).Get(ctx, v.name, metav1.GetOptions{})
			return err == nil && pvc.Status.Phase == corev1.ClaimBound, nil
		}); err != nil {
			return err
		}
	}
	return nil
}

func (l *lifecycle) podsReady() error {
	ctx := l.t.Context()
	for _, v := range l.vols {
		ctr := corev1.Container{Name: "app", Image: "busybox"}
		if v.block {
			ctr.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
		} else {
			ctr.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		}
		pod, err := l.m.env.Client.CoreV1().Pods(appNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "app-" + v.name},
			Spec: corev1.PodSpec{NodeName: l.node, Containers: []corev1.Container{ctr},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.name}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		v.pod = pod
		pvName := l.node + "-" + v.name
		if v.block {
			v.path = filepath.Join(l.agent.RootDir, "pods", string(pod.UID), "volumeDevices", "kubernetes.io~csi", pvName)
		} else {
			v.path = filepath.Join(l.agent.RootDir, "pods", string(pod.UID), "volumes", "kubernetes.io~csi", pvName, "mount")
		}
	}
	for _, v := range l.vols {
		if err := l.poll("VolumesReady of the pod of "+v.name, func(ctx context.Context) (bool, error) { return l.ready(ctx, v) }); err != nil {
			return err
		}
	}
	return nil
}

func (l *lifecycle) ready(ctx context.Context, v *volume) (bool, error) {
	return drivertest.VolumesReady(ctx, l.m.env.Client, appNamespace, v.pod.Name)
}

// dataThrough writes random data through each pod's path and reads it back from the LV's device
// as LVM names it, not through the node plugin: debugfs reads the ext4 file from the device, dd
// the block volume's first bytes.
func (l *lifecycle) dataThrough() error {
	for _, v := range l.vols {
		v.data = make([]byte, 64<<10)
		_, _ = rand.Read(v.data)
		if v.block {
			if err := writeSync(v.path, v.data, 0); err != nil {
				return fmt.Errorf("writing the pod's block device %s: %w", v.path, err)
			}
		} else {
			mounted, err := mount.New("").IsMountPoint(v.path)
			if err != nil {
				return err
			}
			if !mounted {
				return fmt.Errorf("the pod's path %s is not a mount point", v.path)
			}
			if err := writeSync(filepath.Join(v.path, "data"), v.data, os.O_CREATE|os.O_TRUNC); err != nil {
				return err
			}
			var st syscall.Stat_t
			if err := syscall.Stat(v.path, &st); err != nil {
				return err
			}
			v.mountDev = st.Dev
		}
		if err := l.readBack(v); err != nil {
			return err
		}
	}
	return nil
}

func writeSync(path string, data []byte, flag int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|flag, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	// syncfs: the file system's metadata on the device too, for debugfs.
	if err := unixSyncfs(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func unixSyncfs(f *os.File) error { return unix.Syncfs(int(f.Fd())) }

func (l *lifecycle) readBack(v *volume) error {
	ctx := l.t.Context()
	dev := l.lvDevice(v)
	var got []byte
	var err error
	if v.block {
		got, err = exec.CommandContext(ctx, "dd", "if="+dev, "bs=64k", "count=1", "iflag=direct", "status=none").Output()
	} else {
		got, err = exec.CommandContext(ctx, "debugfs", "-R", "cat /data", dev).Output()
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", dev, err)
	}
	if !bytes.Equal(got, v.data) {
		return fmt.Errorf("%s holds %d bytes that are not what the pod wrote (%d bytes)", dev, len(got), len(v.data))
	}
	return nil
}

func (l *lifecycle) driverRestart() error {
	if err := l.driver.Kill(); err != nil {
		return err
	}
	<-l.driver.Exited()
	if err := l.driver.Restart(l.t.Context()); err != nil {
		return err
	}
	// The agent's next round with the restarted plugin (its sync period) must leave the mounts.
	time.Sleep(15 * time.Second)
	for _, v := range l.vols {
		if !v.block {
			var st syscall.Stat_t
			if err := syscall.Stat(v.path, &st); err != nil {
				return err
			}
			if st.Dev != v.mountDev {
				return fmt.Errorf("the pod's path %s is another mount after the restart", v.path)
			}
			got, err := os.ReadFile(filepath.Join(v.path, "data"))
			if err != nil {
				return err
			}
			if !bytes.Equal(got, v.data) {
				return errors.New("the file in the pod's path changed across the restart")
			}
		} else {
			f, err := os.Open(v.path)
			if err != nil {
				return fmt.Errorf("the pod's block device after the restart: %w", err)
			}
			got := make([]byte, len(v.data))
			_, err = f.ReadAt(got, 0)
			_ = f.Close()
			if err != nil {
				return err
			}
			if !bytes.Equal(got, v.data) {
				return errors.New("the pod's block device reads other data after the restart")
			}
		}
		if ok, _ := l.ready(l.t.Context(), v); !ok {
			return fmt.Errorf("VolumesReady of the pod of %s is no longer True after the restart", v.name)
		}
	}
	return nil
}

func (l *lifecycle) teardown() error {
	ctx := l.t.Context()
	for _, v := range l.vols {
		if err := l.m.env.Client.CoreV1().Pods(appNamespace).Delete(ctx, v.pod.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	for _, v := range l.vols {
		if err := l.poll("the deletion of the pod of "+v.name+" completed by the agent", drivertest.PodGone(l.m.env.Client, appNamespace, v.pod.Name)); err != nil {
			return err
		}
	}
	if err := drivertest.NothingLeft(l.agent, l.poll); err != nil {
		return err
	}
	var links []string
	_ = filepath.WalkDir(filepath.Join(l.agent.RootDir, "plugins", "kubernetes.io", "csi", "volumeDevices"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSymlink != 0 {
			links = append(links, p)
		}
		return nil
	})
	if len(links) > 0 {
		return fmt.Errorf("symlinks left in the agent's block layout: %v", links)
	}
	return l.noLoopBelow(l.agent.RootDir)
}

// noLoopBelow fails when a loop device is backed by a file below dir.
func (l *lifecycle) noLoopBelow(dir string) error {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			return fmt.Errorf("loop device %s left, backed by %s", e.Name(), strings.TrimSpace(string(b)))
		}
	}
	return nil
}

func (l *lifecycle) removeVolumes() error {
	dyn := drivertest.NewApplier(l.t, l.m.env.Config).Dyn
	for _, v := range l.vols {
		if err := dyn.Resource(logicalVolumes).Delete(l.t.Context(), l.node+"-"+v.name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	for _, v := range l.vols {
		if err := l.poll("the LV of "+v.name+" removed", func(ctx context.Context) (bool, error) {
			_, err := dyn.Resource(logicalVolumes).Get(ctx, l.node+"-"+v.name, metav1.GetOptions{})
			_, serr := os.Stat(l.lvDevice(v))
			return apierrors.IsNotFound(err) && os.IsNotExist(serr), nil
		}); err != nil {
			return err
		}
	}
	return nil
}

func (l *lifecycle) poll(what string, cond wait.ConditionWithContextFunc) error {
	return drivertest.Poll(l.t.Context(), what, cond)
}
