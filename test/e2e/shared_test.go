package e2e_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// TestSharedVolumeAcrossPods runs three pods on one ReadWriteMany volume:
// it is staged once, the three publishes run at the same time (a slow
// NodePublishVolume for one pod holds up no other pod), and it is unstaged
// only after the last pod is gone, while the other pods' mounts stay intact.
func TestSharedVolumeAcrossPods(t *testing.T) {
	t.Parallel()
	f := k8stest.New(t)
	f.CreateNode(t)
	a := startAgent(t, f, agentOptions{})
	driver := uniqueDriverName()
	createCSIDriver(t, f, driver, false)
	p := startPlugin(t, a, driver, nodeCaps())
	vol := createVolume(t, p, "shared", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	// Each publish takes long enough that the three can only finish this
	// early if they ran at the same time.
	const publishDelay = 2 * time.Second
	if err := p.SetFaults(plugin.FaultRule{Method: nodePublish, Delay: publishDelay}); err != nil {
		t.Fatal(err)
	}

	pvName := "pv-" + f.Namespace
	createBoundClaim(t, f, claim{PVName: pvName, PVCName: "shared", Driver: driver, Handle: vol.ID, AccessMode: corev1.ReadWriteMany})
	var pods []*corev1.Pod
	for i := range 3 {
		pods = append(pods, createPod(t, f, fmt.Sprintf("app-%d", i), podVolume{Name: "data", ClaimName: "shared"}))
	}
	for _, pod := range pods {
		waitReady(t, f, pod)
	}

	calls := volumeCalls(t, p, vol.ID)
	if n := countCalls(calls, nodeStage); n != 1 || len(okCalls(calls, nodeStage)) != 1 {
		t.Errorf("NodeStageVolume called %d times, want once: %q", n, methods(calls))
	}
	publishes := okCalls(calls, nodePublish)
	if len(publishes) != 3 || countCalls(calls, nodePublish) != 3 {
		t.Fatalf("NodePublishVolume calls = %q, want three that succeeded", methods(calls))
	}
	targets := map[string]bool{}
	for i, c := range publishes {
		targets[c.Begin.TargetPath] = true
		for _, o := range publishes[i+1:] {
			if !c.Overlaps(o) {
				t.Errorf("publishes to %s (%s–%s) and %s (%s–%s) did not overlap", c.Begin.TargetPath,
					c.Begin.Time.Format(time.StampMicro), c.End.Time.Format(time.StampMicro), o.Begin.TargetPath,
					o.Begin.Time.Format(time.StampMicro), o.End.Time.Format(time.StampMicro))
			}
		}
	}
	for _, pod := range pods {
		if !targets[publishPaths(a, pod, pvName).Target] {
			t.Errorf("no publish for pod %s; targets %v", pod.Name, targets)
		}
	}
	if err := p.ClearFaults(); err != nil {
		t.Fatal(err)
	}

	st := stagingPaths(a, driver, vol.ID)
	mounter := mount.New("")
	for i, pod := range pods {
		deletePod(t, f, pod)
		waitCalls(t, p, vol.ID, fmt.Sprintf("unpublish of pod %d", i), hasOK(nodeUnpublish, i+1))
		waitGone(t, "pod "+pod.Name+" directory", filepath.Join(a.Root, "pods", string(pod.UID)))
		if i == len(pods)-1 {
			break
		}
		// The others keep their volume.
		for _, other := range pods[i+1:] {
			target := publishPaths(a, other, pvName).Target
			if ok, err := mounter.IsMountPoint(target); err != nil || !ok {
				t.Errorf("after deleting %s: %s of pod %s is not mounted (err %v)", pod.Name, target, other.Name, err)
			}
			if c, err := volumesReady(t, f, other); err != nil || c == nil || c.Status != corev1.ConditionTrue {
				t.Errorf("after deleting %s: pod %s condition = %+v (err %v), want True", pod.Name, other.Name, c, err)
			}
		}
		if ok, err := mounter.IsMountPoint(st.Path); err != nil || !ok {
			t.Errorf("after deleting %s: staging path not mounted (err %v)", pod.Name, err)
		}
		if n := countCalls(volumeCalls(t, p, vol.ID), nodeUnstage); n != 0 {
			t.Fatalf("NodeUnstageVolume called while %d pods still use the volume", len(pods)-i-1)
		}
	}
	calls = waitCalls(t, p, vol.ID, "unstage after the last pod", hasOK(nodeUnstage, 1))
	unstage := okCalls(calls, nodeUnstage)
	if n := countCalls(calls, nodeUnstage); n != 1 {
		t.Errorf("NodeUnstageVolume called %d times, want once: %q", n, methods(calls))
	}
	unpublishes := okCalls(calls, nodeUnpublish)
	if len(unpublishes) != 3 {
		t.Fatalf("NodeUnpublishVolume calls = %q, want three", methods(calls))
	}
	for _, u := range unpublishes {
		if !endsBefore(u, unstage[0]) {
			t.Errorf("NodeUnstageVolume began before the unpublish of %s returned", u.Begin.TargetPath)
		}
	}
	if got := slices.IndexFunc(calls, func(c plugin.Call) bool { return c.Begin.Method == nodeStage }); got != 0 {
		t.Errorf("first call for the volume is not NodeStageVolume: %q", methods(calls))
	}
	waitGone(t, "staging directory", st.Dir)
	waitInUse(t, f, "empty", func(got []corev1.UniqueVolumeName) bool { return len(got) == 0 })
}
