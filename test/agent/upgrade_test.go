//go:build upgrade

package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moby/sys/mountinfo"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/test/agent/agenttest"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// EnvPreviousBinary names the csi-volmgr binary of the previous release
// (hack/release/previous), which make test-upgrade builds; the binary under
// test is agenttest's (CSI_VOLMGR_BINARY, or this checkout built).
const EnvPreviousBinary = "CSI_VOLMGR_PREVIOUS_BINARY"

// TestUpgradeAndRollbackUnderLiveVolumes (make test-upgrade) replaces the
// previous release's agent by this one over the same root directory, as a
// DaemonSet rollout (SIGTERM, then the new pod) or a package update's
// restart does, and back (a rollback), with pods published on the node: a
// filesystem PV, a block PV, a CSI inline volume and a FUSE-backed PV, each
// staged and published by the agent that runs first. While no agent runs,
// a pod is created and another deleted. After each swap:
//
//   - the agent made no staging, publishing or teardown call (nor an
//     expansion) for the volumes of the pods that stayed;
//   - their mounts are the very same mounts (mount IDs, sources, options);
//   - their VolumesReady condition never left True, its transition time
//     unchanged (a watch saw every write);
//   - `csi-volmgr status` (the running binary's) shows them as before;
//   - the pod created meanwhile is published and ready, the deleted one's
//     volume unpublished and unstaged;
//   - the records carry the format the running agent writes: the new agent
//     migrated the previous release's, the previous release read the new
//     agent's.
//
// At the end every pod is deleted and the previous release tears down every
// volume, those the new agent set up or migrated included: no mount and no
// loop device is left.
func TestUpgradeAndRollbackUnderLiveVolumes(t *testing.T) {
	previous := os.Getenv(EnvPreviousBinary)
	if previous == "" {
		t.Fatalf("%s is not set: run make test-upgrade, which builds the previous release's agent", EnvPreviousBinary)
	}
	current, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, nodeOptions{agentBinary: previous, csiDriver: func(s *storagev1.CSIDriverSpec) {
		s.VolumeLifecycleModes = []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}
		s.PodInfoOnMount = ptr.To(true)
	}})
	n.startAgent(t)
	n.logStep(t, "previous release's agent running")

	fsVol := n.createClaimedVolume(t, "fs")
	blockVol := n.createBlockClaim(t, "block")
	fuseVol := n.claimVolume(t, "fuse", n.createVolumeWithParameters(t, "fuse", map[string]string{plugin.FuseParameter: "true"}), nil)
	leavingUp, leavingDown := n.createClaimedVolume(t, "leaving-up"), n.createClaimedVolume(t, "leaving-down")
	staying := []*corev1.Pod{
		n.createPod(t, "fs", fsVol.claim),
		n.createBlockPod(t, "block", blockVol.claim),
		n.createInlinePod(t, "inline"),
		n.createPod(t, "fuse", fuseVol.claim),
	}
	leaving := map[string]*corev1.Pod{"up": n.createPod(t, "leaving-up", leavingUp.claim), "down": n.createPod(t, "leaving-down", leavingDown.claim)}
	conditions := map[types.UID]corev1.PodCondition{}
	for _, pod := range append(slices.Clone(staying), leaving["up"], leaving["down"]) {
		conditions[pod.UID] = n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	}
	if !isMountPoint(t, n.targetPath(staying[3].UID, fuseVol.pvName)) {
		t.Fatal("the FUSE-backed volume is not mounted at its target")
	}
	watcher := n.watchConditions(t)
	n.logStep(t, "pods published by the previous release")

	swap := func(direction, binary string, leave *corev1.Pod, leaveVol claimedVolume, arriveVol claimedVolume) *corev1.Pod {
		t.Helper()
		before := n.snapshot(t, staying)
		t.Logf("%s: %d volumes, %d mounts below the root before the swap", direction, len(before.status), len(before.mounts))
		if err := n.agent.Stop(); err != nil {
			t.Fatalf("%s: stopping the running agent with SIGTERM: %v", direction, err)
		}
		// No agent runs: a pod comes, a pod goes.
		arriving := n.createPod(t, "arriving-"+direction, arriveVol.claim)
		n.deletePod(t, leave)
		n.agent.StartWith(binary)
		n.startAgent(t)
		n.logStep(t, direction+": other agent running")

		n.waitVolumesReady(t, arriving, corev1.ConditionTrue)
		leaveTarget := n.targetPath(leave.UID, leaveVol.pvName)
		leaveStaging := n.stagingPath(leaveVol.handle)
		n.waitJournal(t, direction+": the deleted pod's volume unpublished and unstaged", func(calls []plugin.Call) bool {
			return len(succeeded(callsOf(calls, "NodeUnpublishVolume", leaveTarget))) > 0 &&
				len(succeeded(callsOf(calls, "NodeUnstageVolume", leaveStaging))) > 0
		})
		n.waitVolumes(t, direction+": the arriving pod published, the leaving one gone", func(vols []volumemanager.VolumeStatus) bool {
			arrived, ok := findVolume(vols, n.volumeName(arriveVol.handle))
			_, left := findVolume(vols, n.volumeName(leaveVol.handle))
			return ok && podState(arrived, arriving.UID) == "Published" && !left
		})
		after := n.snapshot(t, staying)
		n.checkUntouched(t, direction, before, after, arriveVol, leaveVol)
		if isMountPoint(t, leaveTarget) || isMountPoint(t, leaveStaging) {
			t.Errorf("%s: the deleted pod's volume is still mounted", direction)
		}
		n.logStep(t, direction+": checked")
		return arriving
	}

	arrivedUp := swap("upgrade", current, leaving["up"], leavingUp, n.createClaimedVolume(t, "arriving-upgrade"))
	n.checkRecordFormats(t, "after the upgrade", checkpoint.FormatVersion)
	n.checkMigrated(t)
	arrivedDown := swap("rollback", previous, leaving["down"], leavingDown, n.createClaimedVolume(t, "arriving-rollback"))

	for _, pod := range staying {
		for _, c := range watcher.seen(t, pod.UID) {
			want := conditions[pod.UID]
			if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&want.LastTransitionTime) {
				t.Errorf("pod %s: condition %s went %s (transition %v; was True since %v): it flapped during a swap",
					pod.Name, conditionVolumesReady, c.Status, c.LastTransitionTime, want.LastTransitionTime)
			}
		}
	}

	// The end of the node's pods: the previous release tears down what
	// this one set up (the pod that arrived after the upgrade) and the
	// records it migrated, and leaves nothing behind.
	for _, pod := range append(slices.Clone(staying), arrivedUp, arrivedDown) {
		n.deletePod(t, pod)
	}
	n.waitVolumes(t, "every volume torn down by the previous release", func(vols []volumemanager.VolumeStatus) bool { return len(vols) == 0 })
	if mps := n.mountsBelowRoot(t); len(mps) > 0 {
		t.Errorf("mounted after every pod went: %v", mps)
	}
	if loops := loopBackedBelow(t, n.agent.RootDir, n.plugin.Dir); len(loops) > 0 {
		t.Errorf("loop devices left after every pod went: %v", loops)
	}
	n.logStep(t, "every pod gone, every volume torn down")
}

// createInlinePod creates a pod with a CSI inline volume of the node's
// driver.
func (n *node) createInlinePod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: n.f.Namespace, Name: name},
		Spec: corev1.PodSpec{
			NodeName: n.f.NodeName,
			Containers: []corev1.Container{{Name: "c", Image: "busybox",
				VolumeMounts: []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}}},
			Volumes: []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{
				CSI: &corev1.CSIVolumeSource{Driver: n.driver}}}},
		},
	}
	created, err := n.f.Client.CoreV1().Pods(n.f.Namespace).Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return created
}

// swapSnapshot is what must not change across a swap.
type swapSnapshot struct {
	// status is `csi-volmgr status` of the running agent, by volume name,
	// normalized (normalizeStatus).
	status map[string]string
	// mounts are the mounts below the root: mount point → ID, source,
	// type and options, one line per mount.
	mounts map[string]string
	// calls are the plugin's calls so far, by PID and sequence number.
	calls map[string]bool
}

func (n *node) snapshot(t *testing.T, staying []*corev1.Pod) swapSnapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	vols, err := n.agent.StatusCommand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := swapSnapshot{status: map[string]string{}, mounts: map[string]string{}, calls: map[string]bool{}}
	for _, v := range vols {
		s.status[v.Name] = normalizeStatus(t, v)
	}
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(n.agent.RootDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, mi := range infos {
		s.mounts[mi.Mountpoint] += fmt.Sprintf("id=%d source=%s type=%s options=%s super=%s;", mi.ID, mi.Source, mi.FSType, mi.Options, mi.VFSOptions)
	}
	for _, c := range n.calls(t) {
		s.calls[callKey(c)] = true
	}
	return s
}

func callKey(c plugin.Call) string { return fmt.Sprintf("%d/%d", c.PID, c.Seq) }

// normalizeStatus renders what `status` says of a volume that a restart
// must not change: not whether it was reconstructed (every volume is, after
// a restart), nor its usage figures.
func normalizeStatus(t *testing.T, v volumemanager.VolumeStatus) string {
	t.Helper()
	v.Reconstructed = false
	v.Stats = nil
	slices.SortFunc(v.Pods, func(a, b volumemanager.PodStatus) int { return strings.Compare(a.UID, b.UID) })
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// checkUntouched compares the snapshots around a swap for everything but
// the volumes of the pods that came and went.
func (n *node) checkUntouched(t *testing.T, direction string, before, after swapSnapshot, arrived, left claimedVolume) {
	t.Helper()
	moving := map[string]bool{arrived.handle: true, left.handle: true}
	for _, c := range n.calls(t) {
		if before.calls[callKey(c)] || moving[c.Begin.VolumeID] {
			continue
		}
		switch c.Begin.Method {
		case "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeExpandVolume":
			t.Errorf("%s: a call for a volume whose pod stayed:%s", direction, describeCalls([]plugin.Call{c}))
		}
	}
	movingNames := map[string]bool{n.volumeName(arrived.handle): true, n.volumeName(left.handle): true}
	for name, was := range before.status {
		if movingNames[name] {
			continue
		}
		if now, ok := after.status[name]; !ok || now != was {
			t.Errorf("%s: status of %s changed:\nbefore %s\nafter  %s", direction, name, was, now)
		}
	}
	for name := range after.status {
		if _, ok := before.status[name]; !ok && !movingNames[name] {
			t.Errorf("%s: status shows a volume it did not before: %s", direction, after.status[name])
		}
	}
	movingPaths := []string{n.stagingPath(arrived.handle), n.stagingPath(left.handle)}
	isMoving := func(mp string) bool {
		if strings.Contains(mp, "/"+arrived.pvName+"/") || strings.HasSuffix(mp, "/"+arrived.pvName) ||
			strings.Contains(mp, "/"+left.pvName+"/") || strings.HasSuffix(mp, "/"+left.pvName) {
			return true
		}
		return slices.Contains(movingPaths, mp)
	}
	for mp, was := range before.mounts {
		if isMoving(mp) {
			continue
		}
		if now := after.mounts[mp]; now != was {
			t.Errorf("%s: mount %s changed:\nbefore %s\nafter  %s", direction, mp, was, now)
		}
	}
	for mp, now := range after.mounts {
		if _, ok := before.mounts[mp]; !ok && !isMoving(mp) {
			t.Errorf("%s: a new mount %s: %s", direction, mp, now)
		}
	}
}

// checkRecordFormats checks every vol_data.json below the root carries
// format version want.
func (n *node) checkRecordFormats(t *testing.T, when string, want int) {
	t.Helper()
	var records int
	err := filepath.WalkDir(n.agent.RootDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "vol_data.json" {
			return err
		}
		records++
		if v, err := checkpoint.CheckFormat(path); err != nil || v != want {
			t.Errorf("%s: %s has format %d (%v), want %d", when, path, v, err, want)
		}
		return filepath.SkipDir
	})
	if err != nil {
		t.Fatal(err)
	}
	if records == 0 {
		t.Errorf("%s: no records below %s", when, n.agent.RootDir)
	}
}

// checkMigrated checks that the agent's reconstruction report counts the
// records of the previous release it migrated.
func (n *node) checkMigrated(t *testing.T) {
	t.Helper()
	code, body, err := n.agent.Get(t.Context(), volumemanager.ReconstructionPath)
	if err != nil || code != 200 {
		t.Fatalf("GET %s: %d, %v", volumemanager.ReconstructionPath, code, err)
	}
	var rs volumemanager.ReconstructionStatus
	if err := json.Unmarshal(body, &rs); err != nil {
		t.Fatal(err)
	}
	// Each staying pod's publish record, the staged records of its PVs and
	// the remaining leaving pod's: 9 at least.
	if rs.Migrated < 9 || len(rs.Failed) > 0 {
		t.Errorf("reconstruction after the upgrade: %s; want 9 records migrated at least, no failure", body)
	}
}

// conditionWatch records every VolumesReady condition a watch of the
// namespace's pods sees, by pod.
type conditionWatch struct {
	mu  sync.Mutex
	got map[types.UID][]corev1.PodCondition
	// ended says the watch ended before the test: what it saw is not all.
	ended bool
}

// seen returns the conditions seen of a pod; a watch that ended early
// fails t.
func (w *conditionWatch) seen(t *testing.T, uid types.UID) []corev1.PodCondition {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		t.Error("the watch of the pods ended before the test did: conditions may have changed unseen")
	}
	return slices.Clone(w.got[uid])
}

func (n *node) watchConditions(t *testing.T) *conditionWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	list, err := n.f.Client.CoreV1().Pods(n.f.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wi, err := n.f.Client.CoreV1().Pods(n.f.Namespace).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	w := &conditionWatch{got: map[types.UID][]corev1.PodCondition{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			w.mu.Lock()
			w.ended = true
			w.mu.Unlock()
		}()
		for ev := range wi.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if c, ok := volumesReady(pod); ok {
				w.mu.Lock()
				w.got[pod.UID] = append(w.got[pod.UID], c)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wi.Stop()
		<-done
	})
	return w
}
