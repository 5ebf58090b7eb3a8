package agent_test

import (
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestNewerRecordFormatStopsTheAgentAndTouchesNothing: a pod's volume is
// published, the agent stopped, and its record rewritten as a later
// csi-volmgr would write it (format version 2), as after a rollback below
// that version. The agent refuses to start, naming the record and both
// versions; it makes no CSI call, the volume stays mounted and the record
// stays as it is. Put back in a format it knows, the next start takes the
// volume up again without a call.
func TestNewerRecordFormatStopsTheAgentAndTouchesNothing(t *testing.T) {
	t.Parallel()
	n := newNode(t, nodeOptions{})
	n.startAgent(t)
	vol := n.createClaimedVolume(t, "data")
	pod := n.createPod(t, "app", vol.claim)
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	target := n.targetPath(pod.UID, vol.pvName)
	record := strings.TrimSuffix(target, "/mount") + "/vol_data.json"
	if err := n.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	before := len(nodeCalls(n.calls(t)))

	data, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	current := `"` + checkpoint.FormatKey + `":"1"`
	if !strings.Contains(string(data), current) {
		t.Fatalf("record %s does not carry %s: %s", record, current, data)
	}
	newer := strings.Replace(string(data), current, `"`+checkpoint.FormatKey+`":"2"`, 1)
	if err := os.WriteFile(record, []byte(newer), 0o640); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	_ = n.agent.Start(ctx) // may serve /healthz before it reads the records
	select {
	case <-n.agent.Exited():
	case <-ctx.Done():
		t.Fatal("the agent keeps running over a record of a newer format")
	}
	if n.agent.ExitErr() == nil {
		t.Error("the agent exited 0 over a record of a newer format")
	}
	log := n.agent.TailLog(64 << 10)
	for _, want := range []string{record, `has format version \"2\"`, "knows versions up to 1"} {
		if !strings.Contains(log, want) {
			t.Errorf("the agent's log does not say %q; its end:\n%s", want, log[max(0, len(log)-4096):])
		}
	}
	if calls := nodeCalls(n.calls(t)); len(calls) != before {
		t.Errorf("CSI calls by the refusing agent:%s", describeCalls(calls[before:]))
	}
	if !isMountPoint(t, target) || !isMountPoint(t, n.stagingPath(vol.handle)) {
		t.Error("the volume was unmounted")
	}
	if got, _ := os.ReadFile(record); string(got) != newer {
		t.Errorf("the record changed:\n got %s\nwant %s", got, newer)
	}

	// In a format this agent knows, the record is taken up again.
	if err := os.WriteFile(record, data, 0o640); err != nil {
		t.Fatal(err)
	}
	n.startAgent(t)
	n.waitVolumes(t, "the volume published after the record was put back", func(vols []volumemanager.VolumeStatus) bool {
		v, ok := findVolume(vols, n.volumeName(vol.handle))
		return ok && podState(v, pod.UID) == "Published"
	})
	n.waitVolumesReady(t, pod, corev1.ConditionTrue)
	if calls := nodeCalls(n.calls(t)); len(calls) != before {
		t.Errorf("CSI calls after the record was put back, for a volume intact:%s", describeCalls(calls[before:]))
	}
}
