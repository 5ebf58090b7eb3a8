package agent_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// createBlockClaim creates a block volume in the plugin, its PV
// (volumeMode Block) and a claim bound to it.
func (n *node) createBlockClaim(t *testing.T, name string) claimedVolume {
	t.Helper()
	ctx := t.Context()
	conn, err := n.plugin.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	handle := resp.GetVolume().GetVolumeId()
	pvName := n.f.Namespace + "-" + name
	size := resource.MustParse("16Mi")
	claim, err := n.f.Client.CoreV1().PersistentVolumeClaims(n.f.Namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:  ptr.To(corev1.PersistentVolumeBlock),
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			VolumeName:  pvName,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating PVC %s: %v", name, err)
	}
	_, err = n.f.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:  ptr.To(corev1.PersistentVolumeBlock),
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: n.driver, VolumeHandle: handle}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating PV %s: %v", pvName, err)
	}
	t.Cleanup(func() {
		_ = n.f.Client.CoreV1().PersistentVolumes().Delete(context.WithoutCancel(ctx), pvName, metav1.DeleteOptions{})
	})
	claim.Status.Phase = corev1.ClaimBound
	if _, err := n.f.Client.CoreV1().PersistentVolumeClaims(n.f.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("binding PVC %s: %v", name, err)
	}
	return claimedVolume{handle: handle, pvName: pvName, claim: name}
}

// createBlockPod creates a pod whose container maps the claim as a device.
func (n *node) createBlockPod(t *testing.T, name, claim string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: name},
		Spec: corev1.PodSpec{
			NodeName: n.f.NodeName,
			Containers: []corev1.Container{{Name: "c", Image: "busybox",
				VolumeDevices: []corev1.VolumeDevice{{Name: "disk", DevicePath: "/dev/xvda"}}}},
			Volumes: []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
	created, err := n.f.Client.CoreV1().Pods(n.f.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

// blockPaths are the kubelet's block layout paths of one pod's volume.
type blockPaths struct {
	podDevice, publish, globalMap string
}

func (n *node) blockPaths(uid types.UID, pvName string) blockPaths {
	csiDir := filepath.Join(n.agent.RootDir, "plugins", "kubernetes.io", "csi", "volumeDevices")
	return blockPaths{
		podDevice: filepath.Join(n.agent.RootDir, "pods", string(uid), "volumeDevices", "kubernetes.io~csi", pvName),
		publish:   filepath.Join(csiDir, "publish", pvName, string(uid)),
		globalMap: filepath.Join(csiDir, pvName, "dev", string(uid)),
	}
}

// loopBackedBelow lists the loop devices whose backing file is below one of
// dirs.
func loopBackedBelow(t *testing.T, dirs ...string) []string {
	t.Helper()
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		backing := strings.TrimSpace(string(data))
		for _, d := range dirs {
			if strings.HasPrefix(backing, d+"/") {
				out = append(out, e.Name()+" <- "+backing)
			}
		}
	}
	return out
}

// TestBlockVolumeInTheKubeletLayout: a block PVC gives the pod a working
// block device at the kubelet's path (a link to the published device, the
// global map a bind mount held open by a loop device), which survives a
// SIGKILL of the agent untouched; deleting the pod then unmaps, unpublishes
// and unstages, and leaves no loop device, mount or directory behind.
func TestBlockVolumeInTheKubeletLayout(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createBlockClaim(t, "disk")
	pod := n.createBlockPod(t, "db", vol.claim)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	p := n.blockPaths(pod.UID, vol.pvName)

	checkMapped := func(when string) {
		t.Helper()
		if to, err := os.Readlink(p.podDevice); err != nil || to != p.publish {
			t.Fatalf("%s: the pod's device %s -> %q (%v), want a link to %s", when, p.podDevice, to, err, p.publish)
		}
		for _, dev := range []string{p.podDevice, p.globalMap} {
			if fi, err := os.Stat(dev); err != nil || fi.Mode()&os.ModeDevice == 0 {
				t.Errorf("%s: %s is not a block device: %v %v", when, dev, fi, err)
			}
		}
		if loops := loopBackedBelow(t, n.agent.RootDir); len(loops) != 1 || !strings.HasSuffix(loops[0], p.globalMap) {
			t.Errorf("%s: loop devices over the agent's root = %v, want one holding %s open", when, loops, p.globalMap)
		}
	}
	checkMapped("published")
	// The device works: what the pod writes lands in the volume.
	pattern := bytes.Repeat([]byte("csi-volmgr block "), 256)
	dev, err := os.OpenFile(p.podDevice, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dev.WriteAt(pattern, 4096); err != nil {
		t.Fatal(err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(pattern))
	if _, err := dev.ReadAt(got, 4096); err != nil || !bytes.Equal(got, pattern) {
		t.Errorf("read back through the pod's device: %v, equal %v", err, bytes.Equal(got, pattern))
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	callsBefore := len(nodeCalls(n.calls(t)))

	n.kill(t)
	n.logStep(t, "agent killed with the block volume mapped")
	n.startAgent(t)
	n.waitVolumes(t, "the block volume synced after the restart", func(vols []volumemanager.VolumeStatus) bool {
		v, ok := findVolume(vols, n.volumeName(vol.handle))
		return ok && v.State == "Staged" && podState(v, pod.UID) == "Published"
	})
	n.waitQueuesDrained(t)
	checkMapped("after the restart")
	if extra := nodeCalls(n.calls(t))[callsBefore:]; len(extra) > 0 {
		t.Errorf("CSI calls after the restart for an intact block map, want none:%s", describeCalls(extra))
	}

	n.deletePod(t, pod)
	n.waitJournal(t, "unstage", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", ""))) == 1
	})
	n.waitVolumes(t, "the volume forgotten", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	if loops := loopBackedBelow(t, n.agent.RootDir, n.plugin.Dir); len(loops) > 0 {
		t.Errorf("loop devices left after teardown: %v", loops)
	}
	if m := n.mountsBelowRoot(t); len(m) > 0 {
		t.Errorf("mounts left below the root: %v", m)
	}
	for _, path := range []string{p.podDevice, p.publish, p.globalMap, filepath.Dir(filepath.Dir(p.globalMap)),
		filepath.Join(n.agent.RootDir, "pods", string(pod.UID))} {
		if exists(t, path) {
			t.Errorf("%s left after teardown", path)
		}
	}
}
