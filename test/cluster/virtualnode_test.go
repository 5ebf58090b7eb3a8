//go:build e2e

package cluster_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestVirtualNodeRunsPodsWithCSIVolumes is the whole path on a real
// control plane: the scheduler binds a pod to the virtual node (taint,
// toleration, capacity); the PV controller binds its pre-created PVs and
// the ephemeral-volume controller creates the claim of its generic
// ephemeral volume, and the pod has a CSI inline volume too (the plugin
// makes it at its first publish and deletes it at its last unpublish); the
// attach/detach controller creates the
// VolumeAttachments once the Node lists the volumes in use, the
// external-attacher calls ControllerPublishVolume and marks them
// attached; the agent stages and publishes; the example runtime runs the
// container, which writes through its mounts and through the device of a
// block volume, and runs with the group one PV asks for
// (pv.beta.kubernetes.io/gid) among its supplemental groups; the runtime's
// /stats/summary carries the CSI volumes' stats. Deleting the pod stops the
// process before anything is unpublished, then unpublishes and unstages,
// and each VolumeAttachment goes only after the Node stopped listing its
// volume.
func TestVirtualNodeRunsPodsWithCSIVolumes(t *testing.T) {
	c := startCluster(t, "--volume-stats-period=1s")
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
	// The containers of pods using pv-data get this group (the kubelet's
	// GetExtraSupplementalGroupsForPod); the pod has one of its own.
	const volumeGroup, podGroup = 2345, 1234
	if _, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, "pv-data", types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{"pv.beta.kubernetes.io/gid":"%d"}}}`, volumeGroup), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// pv-data and pv-shared both fit either claim: each claim names its PV.
	c.claimOf("data", "", "pv-data")
	c.claimOf("shared", "", "pv-shared")
	c.claim("raw", "", corev1.PersistentVolumeBlock)
	pod := c.pod("app", "id -G > /data/groups || exit 1; for d in data shared scratch inline; do echo hello > /$d/hello || exit 1; done; "+
		"printf 'hello from a block device' | dd of=/dev/xvdr conv=notrunc 2>/dev/null || exit 1; exec sleep 3600",
		claimVolume("data", "data"), claimVolume("shared", "shared"), ephemeralVolume("scratch", staticClass),
		inlineVolume("inline", noAttachDriver))
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{SupplementalGroups: []int64{podGroup}}
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
	// The CSI inline volume: made by its first publish, written through.
	c.waitFor("hello in the CSI inline volume", func(context.Context) (bool, error) {
		vols, err := c.noAttach.Volumes()
		if err != nil {
			return false, err
		}
		for _, v := range vols {
			if v.Ephemeral {
				data, err := os.ReadFile(filepath.Join(v.Path, "hello"))
				if err == nil && string(data) == "hello\n" {
					handles["inline"] = v.ID
					return true, nil
				}
			}
		}
		return false, nil
	})
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
	// The container runs with its pod's group and its volume's.
	groups := strings.Fields(string(readVolumeFile(t, c.attach, handles["pv-data"], "groups")))
	for _, g := range []int64{podGroup, volumeGroup} {
		if !slices.Contains(groups, strconv.FormatInt(g, 10)) {
			t.Errorf("the container's groups (id -G) are %v: want %d among them", groups, g)
		}
	}
	// The agent's status API names the pod and its published paths, and
	// the group of pv-data.
	var state volumemanager.PodVolumes
	getJSON(t, c.agentSocket, "/api/v1/pods/"+c.namespace+"/app", &state)
	if state.UID != created.UID || state.State != volumemanager.PodVolumesReady || len(state.Volumes) != 5 {
		t.Errorf("agent's pod status %+v: want Ready with 5 volumes", state)
	}
	if !slices.Equal(state.SupplementalGroups, []int64{volumeGroup}) {
		t.Errorf("agent's pod status supplementalGroups %v, want [%d]", state.SupplementalGroups, volumeGroup)
	}
	for _, v := range state.Volumes {
		if (v.Name == "raw") != (v.DevicePath != "" && v.HostPath == "") {
			t.Errorf("volume %+v: want a device path for the block volume raw, a host path for the others", v)
		}
		if v.Name == "raw" {
			// The pod's device, where the kubelet keeps it: a link to the
			// published device.
			link, err := os.Lstat(v.DevicePath)
			dev, statErr := os.Stat(v.DevicePath)
			if !strings.Contains(v.DevicePath, "/pods/"+string(created.UID)+"/volumeDevices/kubernetes.io~csi/") ||
				err != nil || link.Mode()&os.ModeSymlink == 0 || statErr != nil || dev.Mode()&os.ModeDevice == 0 {
				t.Errorf("block volume raw at %s (%v, %v): want a link below <root>/pods/<uid>/volumeDevices/kubernetes.io~csi/ to a device", v.DevicePath, err, statErr)
			}
		}
		if (v.Name == "data") != (v.SupplementalGroup != nil && *v.SupplementalGroup == volumeGroup) {
			t.Errorf("volume %+v: want supplementalGroup %d for data only", v, volumeGroup)
		}
	}
	// The runtime's /stats/summary: the CSI volumes' stats, by the pod's
	// names for them, with their claims.
	claims := map[string]string{"data": "data", "shared": "shared", "scratch": "app-scratch"}
	c.waitFor("the volumes' stats in the runtime's /stats/summary", func(ctx context.Context) (bool, error) {
		vols := podVolumeStats(ctx, t, c.kubeletAPI, created.UID)
		for name, claim := range claims {
			v, ok := vols[name]
			if !ok {
				return false, nil
			}
			if v.CapacityBytes == nil || *v.CapacityBytes == 0 || v.PVCRef == nil || v.PVCRef.Name != claim {
				return false, fmt.Errorf("volume %s in /stats/summary: %+v, want its capacity and claim %s", name, v, claim)
			}
		}
		return true, nil
	})
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
				// The inline volume is deleted by its last unpublish.
				if v.Staged != nil || len(v.Published) > 0 || len(v.Attachments) > 0 || v.Ephemeral {
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

// getJSON asks the agent's API socket for path and decodes the answer.
func getJSON(t *testing.T, socket, path string, v any) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := client.Get("http://csi-volmgr" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s on %s: %s", path, socket, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// readVolumeFile returns the content of name in the volume handle of p.
func readVolumeFile(t *testing.T, p *plugintest.Plugin, handle, name string) []byte {
	t.Helper()
	vols, err := p.Volumes()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if v.ID == handle {
			data, err := os.ReadFile(filepath.Join(v.Path, name))
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
	t.Fatalf("no volume %s in plugin %s", handle, p.Name)
	return nil
}

// podVolumeStats returns the volume stats of pod uid in the stats summary
// of the kubelet API at addr (self-signed HTTPS), by volume name.
func podVolumeStats(ctx context.Context, t *testing.T, addr string, uid types.UID) map[string]statsv1alpha1.VolumeStats {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the example runtime's self-signed certificate
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/stats/summary", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /stats/summary: %s", resp.Status)
	}
	var summary statsv1alpha1.Summary
	if err := json.NewDecoder(resp.Body).Decode(&summary); err != nil {
		t.Fatal(err)
	}
	out := map[string]statsv1alpha1.VolumeStats{}
	for _, p := range summary.Pods {
		if p.PodRef.UID == string(uid) {
			for _, v := range p.VolumeStats {
				out[v.Name] = v
			}
		}
	}
	return out
}
