package reconciler

import (
	"slices"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// What a container orchestrator staged and published through the front
// endpoint (External in the actual state) is not in the desired state, yet
// the reconciler must not tear it down: it is the caller's. A volume of the
// reconciler's own that nobody wants is still torn down.
func TestExternalVolumesAreLeftToTheirCaller(t *testing.T) {
	h := newHarness(t)
	ext := volume.PersistentName(testDriver, "co-volume")
	extID := volume.ID{Driver: testDriver, Handle: "co-volume", AccessType: volume.Filesystem}
	extPod := volume.PodKey{Volume: ext, Pod: "front-0123"}
	h.actual.RecordStage(ext, extID, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: "/co/staging", External: true})
	h.actual.RecordPublish(extPod, extID, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: "/co/target", External: true})
	orphan := volume.PersistentName(testDriver, "orphan")
	h.actual.RecordStage(orphan, volume.ID{Driver: testDriver, Handle: "orphan", PVName: "pv-orphan", AccessType: volume.Filesystem},
		asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: "/root/plugins/orphan/globalmount"})

	close(h.synced)
	h.r.resync()
	h.r.DriverRegistered(testDriver)
	eventually(t, "the orphan unstaged and the caller's keys handled", func() bool {
		return slices.Contains(h.ops.history(), "unstage "+string(orphan)) && h.seenCount(ext) > 0 && h.seenCount(extPod) > 0
	})
	for _, call := range h.ops.history() {
		if call == "unpublish "+extPod.String() || call == "unstage "+string(ext) {
			t.Errorf("the reconciler tore down the caller's volume: %q", h.ops.history())
		}
	}
	if v, ok := h.actual.Volume(ext); !ok || v.Stage != volume.Staged {
		t.Errorf("the caller's volume = %+v (known %v), want still Staged", v, ok)
	}
}
