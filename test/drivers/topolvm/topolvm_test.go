//go:build drivers

package topolvm_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
	"github.com/csi-volmgr/csi-volmgr/test/drivers/drivertest"
	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	driverName    = "topolvm.io"
	driverModule  = "github.com/topolvm/topolvm"
	driverVersion = "v0.38.0"

	// binDir is bin/drivers/<binDir>, filled by make drivers-bins-topolvm; toolsDir is the
	// build-only module.
	binDir   = "topolvm"
	toolsDir = "test/drivers/topolvm/tools"

	// deviceClass is the lvmd device class of the test's volume group.
	deviceClass = "matrix"
	// vgSize is the size of the sparse file behind the volume group.
	vgSize = 4 << 30
)

// TestTopoLVM is the driver's row of the matrix: csi-volmgr check against its node plugin and
// controller, then the agent's lifecycle with it on a real API server. The Result is written even when a step fails.
func TestTopoLVM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the driver matrix needs root: LVM, loop devices and mounts")
	}
	for _, tool := range []string{"lvm", "losetup", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (make drivers-bins-topolvm installs lvm2)", tool, err)
		}
	}
	if err := deviceMapper(); err != nil {
		t.Fatalf("TopoLVM cannot run on this machine: %v", err)
	}
	began := time.Now()
	rec := drivertest.NewRecorder(t, driverresult.Result{
		Name: "topolvm", Driver: driverName, Kind: "block and filesystem (LVM)",
		Module: driverModule, Version: driverVersion,
		Settings: chartSettings(),
	})
	defer rec.Write(began)
	m := startMatrix(t)
	rec.R.NodePluginFlags = nodeFlags("<root-dir>/plugins/topolvm.io/node/csi-topolvm.sock", "/etc/topolvm/lvmd.yaml")
	rec.Note("topolvm-node runs with --embed-lvmd (the chart's node.lvmdEmbedded=true) and " +
		"lvm-command-prefix [lvm] (no nsenter into PID 1: the test runs on the host)")
	rec.Note("driver defect: topolvm-node (internal/runners/metrics_exporter.go:249, updateNode) panics " +
		"(\"assignment to entry in nil map\") on a Node object without annotations; a kubelet's Node and csi-volmgr " +
		"--register-node's always carry volumes.kubernetes.io/controller-managed-attach-detach, so the matrix gives the " +
		"check's Node that annotation too")
	rec.Note("node-driver-registrar is not served by the module proxy here: the check talks to the node plugin's socket directly")
	runCheck(t, rec, m)
	runLifecycle(t, rec, m)
}

// chartSettings are the values of TopoLVM's Helm chart (charts/topolvm) that make its node plugin
// serve csi-volmgr instead of a kubelet.
func chartSettings() []string {
	return []string{
		"node.kubeletWorkDirectory: csi-volmgr's --root-dir (default /var/lib/csi-volmgr): the chart mounts it " +
			"Bidirectional into topolvm-node, puts the socket in <root-dir>/plugins/topolvm.io/node/csi-topolvm.sock and " +
			"registers through <root-dir>/plugins_registry",
		"node.nodename: the agent's Node name (the chart's spec.nodeName): topolvm-node reconciles the LogicalVolumes of " +
			"that Node and annotates it with its capacity (capacity.topolvm.io/<device-class>)",
		"lvmd.deviceClasses: a volume group of the node; lvmd.lvcreateOptionClasses and thin pools unchanged",
	}
}

// matrix is what the check shares: the control plane, the volume group and the directories.
type matrix struct {
	env *k8stest.Env
	// dir holds the logs, the kubeconfig and the lvmd config; removed after a passing run.
	dir, kubeconfig, vg, lvmdConfig string
	node                            string
}

// startMatrix makes the volume group, starts etcd and kube-apiserver, applies the LogicalVolume
// CRD of the topolvm module, creates the CSIDriver as the chart renders it and the Node the node
// plugin serves, and starts topolvm-controller.
func startMatrix(t *testing.T) *matrix {
	t.Helper()
	dir := k8stest.KeptDir(t, "drivers-topolvm-")
	m := &matrix{dir: dir, node: "topolvm-node-0"}
	m.vg = makeVolumeGroup(t, dir)
	m.lvmdConfig = filepath.Join(dir, "lvmd.yaml")
	lvmd := fmt.Sprintf("socket-name: %s\nlvm-command-prefix: [lvm]\ndevice-classes:\n- name: %s\n  volume-group: %s\n  default: true\n  spare-gb: 0\n",
		filepath.Join(dir, "lvmd.sock"), deviceClass, m.vg)
	if err := os.WriteFile(m.lvmdConfig, []byte(lvmd), 0o600); err != nil {
		t.Fatal(err)
	}

	// Node,RBAC authorization and NodeRestriction: the agent runs as its Node.
	m.env = k8stest.StartNodeRestricted(t, nil)
	ctx := t.Context()
	a := drivertest.NewApplier(t, m.env.Config)
	crd := filepath.Join(drivertest.ModuleDir(t, toolsDir, driverModule), "config", "crd", "bases", "topolvm.io_logicalvolumes.yaml")
	if err := a.ApplyFile(ctx, crd, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitEstablished(ctx, "logicalvolumes.topolvm.io"); err != nil {
		t.Fatal(err)
	}
	c := m.env.Client
	// The CSIDriver of charts/topolvm/templates/controller/csidriver.yaml.
	if _, err := c.StorageV1().CSIDrivers().Create(ctx, &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: driverName},
		Spec: storagev1.CSIDriverSpec{
			AttachRequired:       ptr.To(false),
			PodInfoOnMount:       ptr.To(true),
			StorageCapacity:      ptr.To(true),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The check's Node, with the annotation a kubelet (and csi-volmgr --register-node) gives every
	// Node: topolvm-node panics on a Node without annotations (see the Result's notes).
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.node,
		Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	admin, err := m.env.AddUser("topolvm", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	m.kubeconfig = filepath.Join(dir, "topolvm.kubeconfig")
	if err := os.WriteFile(m.kubeconfig, drivertest.CertKubeconfig(t, m.env.Config, admin), 0o600); err != nil {
		t.Fatal(err)
	}
	drivertest.StartProc(t, dir, "topolvm-controller", drivertest.Binary(t, binDir, "hypertopolvm"),
		[]string{"KUBECONFIG=" + m.kubeconfig}, controllerFlags(m.controllerSocket())...)
	return m
}

func (m *matrix) controllerSocket() string { return filepath.Join(m.dir, "controller.sock") }

// controllerFlags are topolvm-controller's flags (charts/topolvm/templates/controller/deployment.yaml)
// without its webhooks (they need a serving certificate and an API server that can reach them;
// they mutate pods for topolvm-scheduler, which the agent's pods do not go through) and without
// leader election (one replica).
func controllerFlags(sock string) []string {
	return []string{"topolvm-controller", "--csi-socket=" + sock, "--enable-webhooks=false", "--leader-election=false",
		"--metrics-bind-address=0", "--health-probe-bind-address=0"}
}

// nodeFlags are topolvm-node's flags (charts/topolvm/templates/node/daemonset.yaml with
// node.lvmdEmbedded): its socket, its lvmd config and the embedded lvmd.
func nodeFlags(sock, lvmdConfig string) []string {
	return []string{"topolvm-node", "--csi-socket=" + sock, "--embed-lvmd", "--config=" + lvmdConfig,
		"--metrics-bind-address=0"}
}

// nodeEnv is topolvm-node's environment: its Node (the chart's NODE_NAME from spec.nodeName), its
// credentials and LVM's own configuration.
func (m *matrix) nodeEnv() []string {
	return []string{"NODE_NAME=" + m.node, "KUBECONFIG=" + m.kubeconfig, "LVM_SYSTEM_DIR=" + filepath.Join(m.dir, "lvm")}
}

// lvmConf keeps LVM off udev (no udev daemon runs here) and limited to the test's loop device.
const lvmConf = `devices {
	obtain_device_list_from_udev = 0
	filter = [ "a|^%s$|", "r|.*|" ]
}
activation {
	udev_sync = 0
	udev_rules = 0
}
global {
	use_lvmetad = 0
}
`

// makeVolumeGroup makes a volume group of a unique name on a loop device backed by a sparse file
// in dir, and removes its logical volumes, the group, the physical volume and the loop device when
// the test ends. LVM is run with LVM_SYSTEM_DIR=<dir>/lvm, which sees only that loop device.
func makeVolumeGroup(t *testing.T, dir string) string {
	t.Helper()
	file := filepath.Join(dir, "vg.img")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(vgSize); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "losetup", "--find", "--show", file).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.CommandContext(context.WithoutCancel(t.Context()), "losetup", "-d", loop).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", loop, err, out)
		}
	})
	lvmDir := filepath.Join(dir, "lvm")
	if err := os.MkdirAll(lvmDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lvmDir, "lvm.conf"), []byte(fmt.Sprintf(lvmConf, loop)), 0o600); err != nil {
		t.Fatal(err)
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	vg := "csivolmgr-" + hex.EncodeToString(suffix)
	lvm := func(ctx context.Context, args ...string) error {
		cmd := exec.CommandContext(ctx, "lvm", args...)
		cmd.Env = append(os.Environ(), "LVM_SYSTEM_DIR="+lvmDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lvm %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := lvm(t.Context(), "pvcreate", "-y", loop); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lvm(context.WithoutCancel(t.Context()), "pvremove", "-y", loop); err != nil {
			t.Error(err)
		}
	})
	if err := lvm(t.Context(), "vgcreate", "-y", vg, loop); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		if err := lvm(ctx, "lvremove", "-y", vg); err != nil {
			t.Error(err)
		}
		if err := lvm(ctx, "vgremove", "-y", vg); err != nil {
			t.Error(err)
		}
	})
	return vg
}

// deviceMapper fails when the kernel has no device-mapper: LVM then creates a logical volume's
// metadata but cannot activate it ("/dev/mapper/control: open failed: No such device"), and every
// CreateVolume of TopoLVM fails; nothing of the driver can be checked.
func deviceMapper() error {
	b, err := os.ReadFile("/proc/misc")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "device-mapper" {
			return nil
		}
	}
	return errors.New("the kernel has no device-mapper (none in /proc/misc): LVM cannot activate the logical " +
		"volumes TopoLVM creates (lvcreate: \"/dev/mapper/control: open failed: No such device\")")
}
