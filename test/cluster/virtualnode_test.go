//go:build e2e

package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestVirtualNodeRunsPodsWithCSIVolumes is the whole path on a real
// control plane: the scheduler binds a pod to the virtual node (taint,
// toleration, capacity); the PV controller binds its pre-created PVs and
// the ephemeral-volume controller creates the claim of its generic
// ephemeral volume; the attach/detach controller creates the
// VolumeAttachments once the Node lists the volumes in use, the
// external-attacher calls ControllerPublishVolume and marks them
// attached; the agent stages and publishes; the example runtime runs the
// container, which writes through its mounts and through the device of a
// block volume. Deleting the pod stops the
// process before anything is unpublished, then unpublishes and unstages,
// and each VolumeAttachment goes only after the Node stopped listing its
// volume.
func TestVirtualNodeRunsPodsWithCSIVolumes(t *testing.T) {
	c := startCluster(t)
	tl := watchTimeline(t, c.client, c.namespace, c.node)
	ctx := t.Context()

	handles := map[string]string{
		"pv-data":    c.staticVolume(c.attach, "pv-data", ""),
		"pv-shared":  c.staticVolume(c.noAttach, "pv-shared", ""),
		"pv-scratch": c.staticVolume(c.attach, "pv-scratch", staticClass),
		"pv-raw":     c.staticVolumeOf(c.attach, "pv-raw", "", corev1.PersistentVolumeBlock),
	}
	for _, pv := range []string{"pv-data", "pv-scratch", "pv-raw"} {
		tl.track(pv, corev1.UniqueVolumeName(volume.PersistentName(attachDriver, handles[pv])))
	}
	c.claim("data", "")
	c.claim("shared", "")
	c.claim("raw", "", corev1.PersistentVolumeBlock)
	pod := c.pod("app", "for d in data shared scratch; do echo hello > /$d/hello || exit 1; done; "+
		"printf 'hello from a block device' | dd of=/dev/xvdr conv=notrunc 2>/dev/null || exit 1; exec sleep 3600",
		claimVolume("data", "data"), claimVolume("shared", "shared"), ephemeralVolume("scratch", staticClass))
	// The block volume is a device of the container, not a mount.
	pod.Spec.Volumes = append(pod.Spec.Volumes, claimVolume("raw", "raw"))
	pod.Spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "raw", DevicePath: "/dev/xvdr"}}
	created, err := c.client.CoreV1().Pods(c.namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var running *corev1.Pod
	c.waitFor("the pod to run", func(ctx context.Context) (bool, error) {
		p, err := c.client.CoreV1().Pods(c.namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod ended: %s", p.Status.Phase)
		}
		running = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if running.Spec.NodeName != c.node {
		t.Errorf("pod scheduled to %q, want the virtual node %q", running.Spec.NodeName, c.node)
	}
	// What a user sees.
	out, err := exec.CommandContext(ctx, filepath.Join(binDir(t), "kubectl"), "--kubeconfig="+c.kubeconfig,
		"get", "pod", pod.Name, "--namespace="+c.namespace, "-o", "wide").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Running") || !strings.Contains(string(out), c.node) {
		t.Errorf("kubectl get pod -o wide: %v\n%s\nwant Running on %s", err, out, c.node)
	}
	t.Logf("kubectl get pod -o wide:\n%s", out)
	if !hasCondition(running, "csi-volmgr.io/VolumesReady") {
		t.Errorf("running pod has no VolumesReady=True condition: %+v", running.Status.Conditions)
	}
	// The container wrote through each of its mounts into the drivers' volumes.
	ephemeralPV := boundPV(t, c, pod.Name+"-scratch")
	if ephemeralPV != "pv-scratch" {
		t.Errorf("ephemeral claim bound to %q, want pv-scratch", ephemeralPV)
	}
	for pv, p := range map[string]*plugintest.Plugin{"pv-data": c.attach, "pv-shared": c.noAttach, "pv-scratch": c.attach} {
		c.waitFor("hello in "+pv, func(context.Context) (bool, error) {
			vols, err := p.Volumes()
			if err != nil {
				return false, err
			}
			for _, v := range vols {
				if v.ID == handles[pv] {
					data, err := os.ReadFile(filepath.Join(v.Path, "hello"))
					return err == nil && string(data) == "hello\n", nil
				}
			}
			return false, nil
		})
	}
	// The container wrote through its device into the block volume's image.
	c.waitFor("the block volume written", func(context.Context) (bool, error) {
		vols, err := c.attach.Volumes()
		if err != nil {
			return false, err
		}
		for _, v := range vols {
			if v.ID == handles["pv-raw"] {
				f, err := os.Open(v.Path)
				if err != nil {
					return false, err
				}
				defer f.Close()
				buf := make([]byte, len("hello from a block device"))
				_, err = f.ReadAt(buf, 0)
				return err == nil && string(buf) == "hello from a block device", nil
			}
		}
		return false, nil
	})
	// The agent's status API names the pod and its published paths.
	var state volumemanager.PodVolumes
	getJSON(t, "http://"+c.agentHTTP+"/api/v1/pods/"+c.namespace+"/app", &state)
	if state.UID != created.UID || state.State != volumemanager.PodVolumesReady || len(state.Volumes) != 4 {
		t.Errorf("agent's pod status %+v: want Ready with 4 volumes", state)
	}
	for _, v := range state.Volumes {
		if (v.Name == "raw") != (v.DevicePath != "" && v.HostPath == "") {
			t.Errorf("volume %+v: want a device path for the block volume raw, a host path for the others", v)
		}
	}
	_, vols := tl.snapshot()
	for _, pv := range []string{"pv-data", "pv-scratch", "pv-raw"} {
		if vols[pv].attached.IsZero() {
			t.Errorf("no attached VolumeAttachment seen for %s", pv)
		}
	}
	if _, ok := vols["pv-shared"]; ok {
		t.Error("a VolumeAttachment was made for the volume of the driver that needs no attach")
	}

	// Delete: the process stops before any unpublish.
	pids := processesOf(t, c.namespace+"/app")
	if len(pids) == 0 {
		t.Fatal("cannot find the container's process")
	}
	if err := c.client.CoreV1().Pods(c.namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the process to stop, then the unpublishes", func(context.Context) (bool, error) {
		unpublished := unpublishes(t, c, handles) // read before looking at the process
		processAlive := slices.ContainsFunc(pids, alive)
		if processAlive && len(unpublished) > 0 {
			return false, fmt.Errorf("%v unpublished while the container process still runs", unpublished)
		}
		return !processAlive && len(unpublished) == len(handles), nil
	})
	c.waitFor("the pod and its VolumeAttachments to go", func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().Pods(c.namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		vas, err := c.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		return err == nil && len(vas.Items) == 0, nil
	})
	c.waitFor("every volume unstaged and detached in the plugins", func(context.Context) (bool, error) {
		for _, p := range []*plugintest.Plugin{c.attach, c.noAttach} {
			vols, err := p.Volumes()
			if err != nil {
				return false, err
			}
			for _, v := range vols {
				if v.Staged != nil || len(v.Published) > 0 || len(v.Attachments) > 0 {
					return false, nil
				}
			}
		}
		return true, nil
	})
	_, vols = tl.snapshot()
	for _, pv := range []string{"pv-data", "pv-scratch", "pv-raw"} {
		v := vols[pv]
		if v.detached.IsZero() || v.notInUse.IsZero() || v.detached.Before(v.notInUse) {
			t.Errorf("%s: VolumeAttachment deleted at %v, volume left volumesInUse at %v: want the detach after", pv, v.detached, v.notInUse)
		}
	}
}

func hasCondition(pod *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// boundPV returns the PV the claim is bound to, waiting for the binding.
func boundPV(t *testing.T, c *cluster, claim string) string {
	var pv string
	c.waitFor("claim "+claim+" bound", func(ctx context.Context) (bool, error) {
		pvc, err := c.client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pv = pvc.Spec.VolumeName
		return pvc.Status.Phase == corev1.ClaimBound, nil
	})
	return pv
}

// unpublishes returns the PVs whose volume got a NodeUnpublishVolume call.
func unpublishes(t *testing.T, c *cluster, handles map[string]string) []string {
	t.Helper()
	var out []string
	for _, p := range []*plugintest.Plugin{c.attach, c.noAttach} {
		entries, err := p.ReadJournal()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Method != "NodeUnpublishVolume" || e.Event != plugin.EventBegin {
				continue
			}
			for pv, h := range handles {
				if h == e.VolumeID && !slices.Contains(out, pv) {
					out = append(out, pv)
				}
			}
		}
	}
	return out
}

// processesOf returns the PIDs of the processes whose environment has
// E2E_POD=pod (the example runtime passes the container's env).
func processesOf(t *testing.T, pod string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(env), "\x00"), "E2E_POD="+pod) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}
