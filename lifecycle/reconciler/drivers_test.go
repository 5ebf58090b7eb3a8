package reconciler

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// TestOwnershipProgressIsTheCondition: while a long fsGroup ownership
// change runs, the pod's condition says how far it came.
func TestOwnershipProgressIsTheCondition(t *testing.T) {
	h := newHarness(t)
	src := pvSource("h1")
	name := volume.PersistentName(testDriver, "h1")
	key := volume.PodKey{Volume: name, Pod: "p1"}
	release := h.ops.setHold("publish " + key.String())
	t.Cleanup(release)
	h.setPod("p1", src)
	eventually(t, "a publish running", func() bool { return slices.Contains(h.ops.history(), "publish "+key.String()) })
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	h.actual.RecordProgress(key, id(src), &asw.Progress{Step: volume.StepApplyAccessControl, FSGroup: 2000,
		Files: 125000, Started: start, Updated: start.Add(31 * time.Second)})
	h.r.PodStatusChanged("p1")
	s, _ := h.status.get("p1")
	want := "changing the group of the volume's files to fsGroup 2000: 125000 files in 31s"
	if s.Ready || s.Reason != status.ReasonVolumesPending || !strings.Contains(s.Message, want) {
		t.Errorf("status = %+v, want VolumesPending with %q", s, want)
	}
}

// TestSELinuxContextChangeRestages: a volume staged with one SELinux
// context, wanted now by a pod with another, is unstaged once the old
// pod's publish is gone and staged again, as the kubelet remounts the
// device.
func TestSELinuxContextChangeRestages(t *testing.T) {
	h := newHarness(t)
	close(h.synced)
	old, next := pvSource("h1"), pvSource("h1")
	old.SELinuxContext, next.SELinuxContext = "system_u:object_r:container_file_t:s0:c1,c2", "system_u:object_r:container_file_t:s0:c3,c4"
	name := string(volume.PersistentName(testDriver, "h1"))
	h.setPod("a", old)
	h.waitCalls(t, "attach "+name, "stage "+name, "publish "+name+"@a")
	h.desired.DeletePod("a")
	h.setPod("b", next)
	h.waitCalls(t, "attach "+name, "stage "+name, "publish "+name+"@a",
		"unpublish "+name+"@a", "unstage "+name, "attach "+name, "stage "+name, "publish "+name+"@b")
	if v, _ := h.actual.Volume(volume.Name(name)); v.SELinuxContext != next.SELinuxContext {
		t.Errorf("volume staged with %q, want %q", v.SELinuxContext, next.SELinuxContext)
	}
}
