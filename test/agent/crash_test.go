package agent_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// The process-level crash tests of issue 4: the agent is SIGKILLed at a
// chosen point of a volume's lifecycle (the plugin holds the next call until
// the test kills the agent), restarted over the same root directory, and
// what it did afterwards is read from the plugin's journal and the mount
// table.

// TestCrashAfterStageBeforePublish: killed after NodeStageVolume succeeded
// and while NodePublishVolume is in the plugin, the restarted agent finds
// the staging mount intact and publishes without staging again.
func TestCrashAfterStageBeforePublish(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")
	staging := n.stagingPath(vol.handle)

	n.setFaults(t, plugin.FaultRule{Method: "NodePublishVolume", VolumeID: vol.handle, Hang: true})
	pod := n.createPod(t, "app", vol.claim)
	target := n.targetPath(pod.UID, vol.pvName)
	n.waitJournal(t, "NodeStageVolume done and NodePublishVolume begun", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeStageVolume", staging))) == 1 && len(callsOf(calls, "NodePublishVolume", target)) == 1
	})
	n.kill(t)
	n.logStep(t, "agent killed during NodePublishVolume")
	if !isMountPoint(t, staging) || isMountPoint(t, target) {
		t.Fatalf("at the kill: staging mounted %v, target mounted %v; want only the staging path mounted", isMountPoint(t, staging), isMountPoint(t, target))
	}

	n.setFaults(t)
	n.startAgent(t)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	n.logStep(t, "volumes ready after restart")

	calls := n.calls(t)
	if stages := callsOf(calls, "NodeStageVolume", ""); len(stages) != 1 {
		t.Errorf("NodeStageVolume called %d times, want once: the staging mount was intact:%s", len(stages), describeCalls(stages))
	}
	publishes := callsOf(calls, "NodePublishVolume", target)
	if len(publishes) != 2 || publishes[1].Code().String() != "OK" {
		t.Errorf("NodePublishVolume calls %v, want the interrupted one and one that succeeded:%s", methods(publishes), describeCalls(publishes))
	}
	if teardown := teardownCalls(calls); len(teardown) > 0 {
		t.Errorf("teardown of a volume its pod still wants:%s", describeCalls(teardown))
	}
	if !isMountPoint(t, staging) || !isMountPoint(t, target) {
		t.Errorf("after restart: staging mounted %v, target mounted %v; want both", isMountPoint(t, staging), isMountPoint(t, target))
	}
	n.waitVolumes(t, "the volume staged and published", func(vols []volumemanager.VolumeStatus) bool {
		v, ok := findVolume(vols, n.volumeName(vol.handle))
		return ok && len(vols) == 1 && v.State == "Staged" && podState(v, pod.UID) == "Published" && v.LastError == nil
	})
}

// TestCrashAfterUnpublishBeforeUnstage is kubernetes#85476: killed after
// NodeUnpublishVolume of the last pod and while NodeUnstageVolume is in the
// plugin, the restarted agent still unstages the volume, from its staged
// record, and leaves no mount, directory or record behind.
func TestCrashAfterUnpublishBeforeUnstage(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")
	staging := n.stagingPath(vol.handle)
	stagedDir := filepath.Dir(staging)
	pod := n.createPod(t, "app", vol.claim)
	target := n.targetPath(pod.UID, vol.pvName)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)

	n.setFaults(t, plugin.FaultRule{Method: "NodeUnstageVolume", VolumeID: vol.handle, Hang: true})
	n.deletePod(t, pod)
	n.waitJournal(t, "NodeUnpublishVolume done and NodeUnstageVolume begun", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnpublishVolume", target))) == 1 && len(callsOf(calls, "NodeUnstageVolume", staging)) == 1
	})
	n.kill(t)
	n.logStep(t, "agent killed during NodeUnstageVolume")
	if !isMountPoint(t, staging) || !exists(t, filepath.Join(stagedDir, "vol_data.json")) {
		t.Fatalf("at the kill: staging mounted %v, staged record present %v; want both", isMountPoint(t, staging), exists(t, filepath.Join(stagedDir, "vol_data.json")))
	}

	n.setFaults(t)
	n.startAgent(t)
	n.waitJournal(t, "NodeUnstageVolume after the restart", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", staging))) == 1
	})
	n.waitVolumes(t, "no volume", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	n.logStep(t, "unstaged after restart")

	if mps := n.mountsBelowRoot(t); len(mps) != 0 {
		t.Errorf("mounts left below the root: %v", mps)
	}
	for _, p := range []string{stagedDir, filepath.Join(n.agent.RootDir, "pods", string(pod.UID))} {
		if exists(t, p) {
			t.Errorf("%s still exists after the volume was torn down", p)
		}
	}
	calls := nodeCalls(n.calls(t))
	want := []string{"NodeStageVolume:OK", "NodePublishVolume:OK", "NodeUnpublishVolume:OK", "NodeUnstageVolume:Canceled", "NodeUnstageVolume:OK"}
	if got := methods(calls); !slices.Equal(got, want) {
		t.Errorf("node calls = %v, want %v:%s", got, want, describeCalls(calls))
	}
}

// TestCrashMidPublishKeepsLivePodsVolume: a volume is published for a
// running pod and a second pod's NodePublishVolume hangs in the plugin when
// the agent is killed, and still hangs after the restart. The restarted
// agent retries the second publish, which completes once the plugin answers
// again, and never unpublishes or unstages the volume the first pod uses.
func TestCrashMidPublishKeepsLivePodsVolume(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{csiTimeout: 3 * time.Second})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "shared")
	staging := n.stagingPath(vol.handle)
	first := n.createPod(t, "first", vol.claim)
	firstTarget := n.targetPath(first.UID, vol.pvName)
	n.waitVolumesReady(t, first, corev1.ConditionTrue)

	n.setFaults(t, plugin.FaultRule{Method: "NodePublishVolume", VolumeID: vol.handle, Hang: true})
	second := n.createPod(t, "second", vol.claim)
	secondTarget := n.targetPath(second.UID, vol.pvName)
	n.waitJournal(t, "the second pod's NodePublishVolume begun", func(calls []plugin.Call) bool {
		return len(callsOf(calls, "NodePublishVolume", secondTarget)) == 1
	})
	n.kill(t)
	n.logStep(t, "agent killed during the second pod's NodePublishVolume")

	n.startAgent(t)
	n.waitJournal(t, "the restarted agent retrying the second pod's NodePublishVolume", func(calls []plugin.Call) bool {
		return len(callsOf(calls, "NodePublishVolume", secondTarget)) >= 2
	})
	n.waitVolumes(t, "the first pod published, the second not", func(vols []volumemanager.VolumeStatus) bool {
		v, ok := findVolume(vols, n.volumeName(vol.handle))
		return ok && v.State == "Staged" && podState(v, first.UID) == "Published" && podState(v, second.UID) != "Published"
	})
	if !isMountPoint(t, firstTarget) {
		t.Errorf("the first pod's target %s is not mounted while the plugin hangs", firstTarget)
	}
	if c, _ := volumesReady(n.getPod(t, second)); c.Status == corev1.ConditionTrue {
		t.Errorf("second pod's %s is True while its publish hangs", conditionVolumesReady)
	}

	n.setFaults(t)
	n.waitVolumesReady(t, second, corev1.ConditionTrue)
	n.logStep(t, "second pod's volumes ready")

	calls := n.calls(t)
	if teardown := teardownCalls(calls); len(teardown) > 0 {
		t.Errorf("teardown of a volume live pods want:%s", describeCalls(teardown))
	}
	if stages := callsOf(calls, "NodeStageVolume", ""); len(stages) != 1 {
		t.Errorf("NodeStageVolume called %d times, want once:%s", len(stages), describeCalls(stages))
	}
	if pubs := callsOf(calls, "NodePublishVolume", firstTarget); len(pubs) != 1 {
		t.Errorf("the first pod's volume was published %d times, want once:%s", len(pubs), describeCalls(pubs))
	}
	for _, p := range []string{staging, firstTarget, secondTarget} {
		if !isMountPoint(t, p) {
			t.Errorf("%s is not mounted", p)
		}
	}
}

// TestRestartWithIntactMountsMakesNoCalls: killed while everything is
// published, the restarted agent proves the mounts from the mount table and
// makes no CSI call at all for them; the pod's condition stays True.
func TestRestartWithIntactMountsMakesNoCalls(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")
	pod := n.createPod(t, "app", vol.claim)
	before := n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	callsBefore := len(nodeCalls(n.calls(t)))

	n.kill(t)
	n.logStep(t, "agent killed with the volume published")
	n.startAgent(t)
	// Reconstruction records the volume as not known to be attached; it is
	// attached again (a no-op without attachRequired) when the restarted
	// agent syncs it, so this proves the volume was synced.
	n.waitVolumes(t, "the volume synced after the restart", func(vols []volumemanager.VolumeStatus) bool {
		v, ok := findVolume(vols, n.volumeName(vol.handle))
		return ok && v.Attached && v.State == "Staged" && podState(v, pod.UID) == "Published"
	})
	n.waitQueuesDrained(t)
	n.logStep(t, "restarted agent synced")

	calls := nodeCalls(n.calls(t))
	if extra := calls[callsBefore:]; len(extra) > 0 {
		t.Errorf("CSI calls after the restart for intact mounts, want none:%s", describeCalls(extra))
	}
	after, ok := volumesReady(n.getPod(t, pod))
	if !ok || after.Status != corev1.ConditionTrue || !after.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("condition after restart = %+v, want still True since %v", after, before.LastTransitionTime)
	}
	for _, p := range []string{n.stagingPath(vol.handle), n.targetPath(pod.UID, vol.pvName)} {
		if !isMountPoint(t, p) {
			t.Errorf("%s is not mounted after the restart", p)
		}
	}
}

// waitQueuesDrained waits until both reconciler queues have handled every
// key they were given since the agent started: each has had adds, and none
// is queued or in progress.
func (n *node) waitQueuesDrained(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	err := pollUntil(ctx, func() bool {
		families, err := n.agent.Metrics(ctx)
		if err != nil {
			return false
		}
		for _, queue := range []string{"csi_volmgr_volumes", "csi_volmgr_pod_volumes"} {
			labels := map[string]string{"name": queue}
			adds, _ := counter(families, "workqueue_adds_total", labels)
			depth, _ := gauge(families, "workqueue_depth", labels)
			done := histogramCount(families, "workqueue_work_duration_seconds", labels)
			if adds < 1 || depth != 0 || float64(done) < adds {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("the agent's queues did not drain: %v", err)
	}
}

// teardownCalls returns the NodeUnpublishVolume and NodeUnstageVolume calls.
func teardownCalls(calls []plugin.Call) []plugin.Call {
	var out []plugin.Call
	for _, c := range calls {
		if c.Begin.Method == "NodeUnpublishVolume" || c.Begin.Method == "NodeUnstageVolume" {
			out = append(out, c)
		}
	}
	return out
}

func (n *node) getPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := n.f.Client.CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCrashMidStageThenPodDeleted: killed while NodeStageVolume is in the
// plugin, and the pod deleted while the agent is down. The stage may or may
// not have happened, so the restarted agent, which finds the staged record,
// unstages the volume, and publishes nothing.
func TestCrashMidStageThenPodDeleted(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")
	staging := n.stagingPath(vol.handle)

	n.setFaults(t, plugin.FaultRule{Method: "NodeStageVolume", VolumeID: vol.handle, Hang: true})
	pod := n.createPod(t, "app", vol.claim)
	n.waitJournal(t, "NodeStageVolume begun", func(calls []plugin.Call) bool {
		return len(callsOf(calls, "NodeStageVolume", staging)) == 1
	})
	n.kill(t)
	n.logStep(t, "agent killed during NodeStageVolume")
	n.deletePod(t, pod)
	n.setFaults(t)

	n.startAgent(t)
	n.waitJournal(t, "NodeUnstageVolume after the restart", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", staging))) == 1
	})
	n.waitVolumes(t, "no volume", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	n.logStep(t, "unstaged after restart")

	calls := nodeCalls(n.calls(t))
	want := []string{"NodeStageVolume:Canceled", "NodeUnstageVolume:OK"}
	if got := methods(calls); !slices.Equal(got, want) {
		t.Errorf("node calls = %v, want %v:%s", got, want, describeCalls(calls))
	}
	n.assertNothingLeft(t, pod)
}

// TestPodDeletedWhileAgentDown: killed with the volume published, and the
// pod deleted while the agent is down: the restarted agent unpublishes and
// unstages from what it finds on disk, once it has seen that no pod wants
// the volume.
func TestPodDeletedWhileAgentDown(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")
	pod := n.createPod(t, "app", vol.claim)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)

	n.kill(t)
	n.deletePod(t, pod)
	n.startAgent(t)
	n.waitJournal(t, "NodeUnstageVolume after the restart", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", n.stagingPath(vol.handle)))) == 1
	})
	n.waitVolumes(t, "no volume", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	n.logStep(t, "torn down after restart")

	calls := nodeCalls(n.calls(t))
	want := []string{"NodeStageVolume:OK", "NodePublishVolume:OK", "NodeUnpublishVolume:OK", "NodeUnstageVolume:OK"}
	if got := methods(calls); !slices.Equal(got, want) {
		t.Errorf("node calls = %v, want %v:%s", got, want, describeCalls(calls))
	}
	if calls[2].Begin.TargetPath != n.targetPath(pod.UID, vol.pvName) {
		t.Errorf("NodeUnpublishVolume target %s, want %s", calls[2].Begin.TargetPath, n.targetPath(pod.UID, vol.pvName))
	}
	n.assertNothingLeft(t, pod)
}

// TestStopLetsCallInFlightFinish: SIGTERM while NodePublishVolume is in the
// plugin lets the call finish, exits 0 and unmounts nothing; the restarted
// agent finds the publish intact and calls nothing again.
func TestStopLetsCallInFlightFinish(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")

	n.setFaults(t, plugin.FaultRule{Method: "NodePublishVolume", VolumeID: vol.handle, Delay: 2 * time.Second})
	pod := n.createPod(t, "app", vol.claim)
	target := n.targetPath(pod.UID, vol.pvName)
	n.waitJournal(t, "NodePublishVolume begun", func(calls []plugin.Call) bool {
		return len(callsOf(calls, "NodePublishVolume", target)) == 1
	})
	if err := n.agent.Stop(); err != nil {
		t.Fatalf("SIGTERM during NodePublishVolume: %v", err)
	}
	n.logStep(t, "agent stopped")
	calls := nodeCalls(n.calls(t))
	if got, want := methods(calls), []string{"NodeStageVolume:OK", "NodePublishVolume:OK"}; !slices.Equal(got, want) {
		t.Fatalf("node calls at the exit = %v, want %v: the call in flight must finish:%s", got, want, describeCalls(calls))
	}
	if !isMountPoint(t, target) {
		t.Fatalf("target %s not mounted after the agent stopped", target)
	}

	n.setFaults(t)
	n.startAgent(t)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	n.waitVolumes(t, "the volume synced after the restart", func(vols []volumemanager.VolumeStatus) bool {
		v, ok := findVolume(vols, n.volumeName(vol.handle))
		return ok && v.Attached && podState(v, pod.UID) == "Published"
	})
	n.waitQueuesDrained(t)
	if extra := nodeCalls(n.calls(t))[len(calls):]; len(extra) > 0 {
		t.Errorf("CSI calls after the restart for an intact publish, want none:%s", describeCalls(extra))
	}
}

// assertNothingLeft checks that the volume's and the pod's traces are gone
// from the root directory: no mount, no staging directory or record, no
// pod directory.
func (n *node) assertNothingLeft(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if mps := n.mountsBelowRoot(t); len(mps) != 0 {
		t.Errorf("mounts left below the root: %v", mps)
	}
	for _, p := range []string{filepath.Join(n.agent.RootDir, "plugins", "kubernetes.io", "csi", n.driver), filepath.Join(n.agent.RootDir, "pods", string(pod.UID))} {
		if exists(t, p) {
			t.Errorf("%s still exists after the volume was torn down", p)
		}
	}
}

// TestRestartBeforeDriverReturns: the agent and the plugin die together
// with the volume published, and the pod is deleted meanwhile. The agent
// comes back first: it is ready without the driver and tears nothing down
// (it cannot); once the plugin registers again, the volume is unpublished
// and unstaged without another restart.
func TestRestartBeforeDriverReturns(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")
	pod := n.createPod(t, "app", vol.claim)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)

	n.kill(t)
	if err := n.plugin.Kill(); err != nil {
		t.Fatal(err)
	}
	n.deletePod(t, pod)
	if err := n.agent.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	n.waitReady(t)
	n.waitVolumes(t, "the reconstructed volume waiting for its driver", func(vols []volumemanager.VolumeStatus) bool {
		v, ok := findVolume(vols, n.volumeName(vol.handle))
		return ok && len(v.Pods) == 1
	})
	n.logStep(t, "agent ready without the driver")

	if err := n.plugin.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	n.waitJournal(t, "NodeUnstageVolume once the driver is back", func(calls []plugin.Call) bool {
		return len(succeeded(callsOf(calls, "NodeUnstageVolume", n.stagingPath(vol.handle)))) == 1
	})
	n.waitVolumes(t, "no volume", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	n.logStep(t, "torn down once the driver registered")

	calls := nodeCalls(n.calls(t))
	want := []string{"NodeStageVolume:OK", "NodePublishVolume:OK", "NodeUnpublishVolume:OK", "NodeUnstageVolume:OK"}
	if got := methods(calls); !slices.Equal(got, want) {
		t.Errorf("node calls = %v, want %v:%s", got, want, describeCalls(calls))
	}
	n.assertNothingLeft(t, pod)
}
