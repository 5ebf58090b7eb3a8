package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// Identities of the non-root pods: the user and group their containers run
// as, and the fsGroup a runtime adds to their supplemental groups.
const (
	podUser  = 1000
	podGroup = 1000
	fsGroup  = 2000
)

// createSecurePod creates a pod that runs as podUser with fsGroup and the
// given fsGroupChangePolicy, mounting the claim at /data.
func createSecurePod(t *testing.T, f *k8stest.Fixture, name, claimName string, policy corev1.PodFSGroupChangePolicy) *corev1.Pod {
	t.Helper()
	return createClaimPod(t, f, name, claimName, &corev1.PodSecurityContext{
		RunAsUser: ptr.To[int64](podUser), RunAsGroup: ptr.To[int64](podGroup), RunAsNonRoot: ptr.To(true),
		FSGroup: ptr.To[int64](fsGroup), FSGroupChangePolicy: &policy,
	})
}

// createClaimPod creates a pod with the security context whose container
// mounts the claim at /data.
func createClaimPod(t *testing.T, f *k8stest.Fixture, name, claimName string, sc *corev1.PodSecurityContext) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Namespace},
		Spec: corev1.PodSpec{
			NodeName:        f.NodeName,
			SecurityContext: sc,
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}},
		},
	}
	created, err := f.Client.CoreV1().Pods(f.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

// writeAsPod writes a file into dir as the pod's containers would: as
// podUser:podGroup with fsGroup among the supplemental groups, through the
// directory itself (a runtime bind-mounts it into the container; the
// agent's root directory above it is not for pods to traverse).
func writeAsPod(dir, name string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	cmd := exec.Command("/bin/sh", "-c", `echo written-by-pod > "/proc/self/fd/3/$1"`, "sh", name)
	cmd.ExtraFiles = []*os.File{d}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: podUser, Gid: podGroup, Groups: []uint32{fsGroup}}}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// TestFSGroupWithoutVolumeMountGroup is the everyday case of EBS, Ceph RBD
// and most block-backed drivers: no VOLUME_MOUNT_GROUP, a fresh volume
// whose root only root may write, a non-root pod with fsGroup. The agent
// gives the volume's files to the fsGroup after the publish, as the
// kubelet, so the pod can write; with fsGroupChangePolicy OnRootMismatch the
// second pod on the volume finds the root in place and nothing is walked.
func TestFSGroupWithoutVolumeMountGroup(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false) // fsGroupPolicy: ReadWriteOnceWithFSType, the default
	caps := nodeCaps()                   // no VOLUME_MOUNT_GROUP
	p := plugintest.Start(t, plugintest.Options{Name: driver, NodeID: "node-" + f.NodeName, Capabilities: &caps,
		RegistrationDir: a.RegDir, VolumeDirMode: 0o755})
	vol := createVolume(t, p, "data", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	if err := writeAsPod(vol.Path, "before"); err == nil {
		t.Fatal("a non-root pod can write to the fresh volume before its fsGroup was applied; the test proves nothing")
	}
	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "data", Driver: driver, Handle: vol.ID,
		PVSource: &corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: vol.ID, FSType: "ext4"}}})

	walks := func(result string) float64 {
		return a.counter(t, "csi_volmgr_volume_ownership_changes_total",
			map[string]string{"volume_plugin": "kubernetes.io/csi:" + driver, "result": result})
	}
	first := createSecurePod(t, f, "first", "data", corev1.FSGroupChangeOnRootMismatch)
	waitReady(t, f, first)
	target := publishPaths(a, first, pvName).Target
	if err := writeAsPod(target, "by-first"); err != nil {
		t.Fatalf("the non-root pod with fsGroup %d cannot write to its volume: %v", fsGroup, err)
	}
	fi, err := os.Stat(filepath.Join(vol.Path, "by-first"))
	if err != nil {
		t.Fatal(err)
	}
	if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != fsGroup {
		t.Errorf("a file the pod wrote has group %d, want the fsGroup %d (setgid directory)", gid, fsGroup)
	}
	if walks("changed") != 1 || walks("skipped") != 0 {
		t.Errorf("ownership changes after the first pod: changed %v skipped %v, want 1 and 0", walks("changed"), walks("skipped"))
	}
	if n := a.counter(t, "csi_volmgr_volume_ownership_files_total", map[string]string{"volume_plugin": "kubernetes.io/csi:" + driver}); n != 1 {
		t.Errorf("files given to the fsGroup = %v, want 1 (the volume's root)", n)
	}

	second := createSecurePod(t, f, "second", "data", corev1.FSGroupChangeOnRootMismatch)
	waitReady(t, f, second)
	if err := writeAsPod(publishPaths(a, second, pvName).Target, "by-second"); err != nil {
		t.Fatalf("the second pod cannot write: %v", err)
	}
	if walks("changed") != 1 || walks("skipped") != 1 {
		t.Errorf("ownership changes after the second pod: changed %v skipped %v, want 1 and 1 (OnRootMismatch)", walks("changed"), walks("skipped"))
	}

	deletePod(t, f, first)
	deletePod(t, f, second)
	waitCalls(t, p, vol.ID, "unstage", hasOK(nodeUnstage, 1))
}
