package reconciler

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestPodLifecycle(t *testing.T) {
	h := newHarness(t)
	src := pvSource("h1")
	name := volume.PersistentName(testDriver, "h1")
	h.setPod("p1", src)
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1")
	eventually(t, "pod ready", func() bool { s, _ := h.status.get("p1"); return s.Ready })

	// Teardown waits until the desired state has synced.
	key := volume.PodKey{Volume: name, Pod: "p1"}
	before := h.seenCount(key)
	h.desired.DeletePod("p1")
	eventually(t, "the removed use handled", func() bool { return h.seenCount(key) > before })
	if calls := h.ops.history(); len(calls) != 3 {
		t.Fatalf("teardown before sync: %q", calls)
	}
	close(h.synced)
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1",
		"unpublish "+string(name)+"@p1", "unstage "+string(name))
	if _, ok := h.actual.Volume(name); ok {
		t.Error("volume still in the actual state after unstage")
	}
	h.ready.mu.Lock()
	defer h.ready.mu.Unlock()
	if h.ready.n != 1 {
		t.Errorf("pod ready observed %d times, want 1", h.ready.n)
	}
}

func TestSharedVolumeUnstagedAfterLastPod(t *testing.T) {
	h := newHarness(t)
	close(h.synced)
	src := pvSource("shared")
	name := string(volume.PersistentName(testDriver, "shared"))
	h.setPod("a", src)
	h.setPod("b", src)
	eventually(t, "both published", func() bool {
		c := h.ops.history()
		return slices.Contains(c, "publish "+name+"@a") && slices.Contains(c, "publish "+name+"@b")
	})
	h.desired.DeletePod("a")
	eventually(t, "a unpublished", func() bool { return slices.Contains(h.ops.history(), "unpublish "+name+"@a") })
	h.r.resync()
	h.desired.DeletePod("b")
	eventually(t, "unstage", func() bool { return slices.Contains(h.ops.history(), "unstage "+name) })
	calls := h.ops.history()
	if n := strings.Count(strings.Join(calls, "\n"), "stage "+name+"\n"); n != 1 {
		t.Errorf("staged %d times, want once: %q", n, calls)
	}
	if slices.Index(calls, "unstage "+name) < slices.Index(calls, "unpublish "+name+"@b") {
		t.Errorf("unstaged before the last unpublish: %q", calls)
	}
}

// TestNoUnstageWhileTheDesiredStateIsUnsettled: a volume whose last pod
// left is unpublished at once, but unstaged only once the desired state has
// resolved every pod event (a pod not resolved yet may want it, the chaos
// run's first finding); a pod that wants it by then keeps it staged.
func TestNoUnstageWhileTheDesiredStateIsUnsettled(t *testing.T) {
	var settled atomic.Bool
	settled.Store(true)
	h := newHarness(t, func(c *Config) { c.Settled = settled.Load })
	close(h.synced)
	src := pvSource("h1")
	name := string(volume.PersistentName(testDriver, "h1"))
	h.setPod("a", src)
	h.waitCalls(t, "attach "+name, "stage "+name, "publish "+name+"@a")

	settled.Store(false) // pod b has an event the populator has not resolved yet
	h.desired.DeletePod("a")
	h.waitCalls(t, "attach "+name, "stage "+name, "publish "+name+"@a", "unpublish "+name+"@a")
	vkey := volume.Name(name)
	before := h.seenCount(vkey)
	eventually(t, "the volume looked at again while unsettled", func() bool { return h.seenCount(vkey) > before+2 })
	if calls := h.ops.history(); slices.Contains(calls, "unstage "+name) {
		t.Fatalf("unstaged while the desired state was unsettled: %q", calls)
	}
	h.setPod("b", src) // resolved: b wants the volume
	settled.Store(true)
	h.waitCalls(t, "attach "+name, "stage "+name, "publish "+name+"@a", "unpublish "+name+"@a", "publish "+name+"@b")

	settled.Store(false)
	h.desired.DeletePod("b")
	h.waitCalls(t, "attach "+name, "stage "+name, "publish "+name+"@a", "unpublish "+name+"@a", "publish "+name+"@b", "unpublish "+name+"@b")
	settled.Store(true)
	h.waitCalls(t, "attach "+name, "stage "+name, "publish "+name+"@a", "unpublish "+name+"@a", "publish "+name+"@b", "unpublish "+name+"@b",
		"unstage "+name)
}

func TestDriverNotRegisteredThenRegistered(t *testing.T) {
	h := newHarness(t)
	h.drivers.set(testDriver, false)
	h.setPod("p1", pvSource("h1"))
	eventually(t, "condition names the missing driver", func() bool {
		s, _ := h.status.get("p1")
		return !s.Ready && s.Reason == status.ReasonDriverNotRegistered
	})
	if calls := h.ops.history(); len(calls) != 0 {
		t.Fatalf("steps ran without a driver: %q", calls)
	}
	h.drivers.set(testDriver, true)
	h.r.DriverRegistered(testDriver)
	eventually(t, "pod ready after registration", func() bool { s, _ := h.status.get("p1"); return s.Ready })
}

func TestStageFailureIsRetriedAndReported(t *testing.T) {
	h := newHarness(t)
	name := volume.PersistentName(testDriver, "h1")
	h.ops.setFail("stage "+string(name), errors.New("NodeStageVolume: disk on fire"))
	h.setPod("p1", pvSource("h1"))
	eventually(t, "a few failed stages", func() bool {
		return strings.Count(strings.Join(h.ops.history(), "\n"), "stage "+string(name)) >= 3
	})
	s, _ := h.status.get("p1")
	if s.Ready || s.Reason != status.ReasonNodeStageFailed || !strings.Contains(s.Message, "disk on fire") {
		t.Errorf("status = %+v, want NodeStageFailed naming the error", s)
	}
	h.events.mu.Lock()
	got := slices.Clone(h.events.reasons)
	h.events.mu.Unlock()
	if len(got) == 0 || got[0] != status.ReasonNodeStageFailed {
		t.Errorf("events = %v, want NodeStageFailed", got)
	}
	h.ops.setFail("stage "+string(name), nil)
	eventually(t, "ready once stage works", func() bool { s, _ := h.status.get("p1"); return s.Ready })
}

func TestAttachWaitsForVolumesInUse(t *testing.T) {
	inUse := &fakeInUse{reported: map[volume.Name]bool{}}
	h := newHarness(t, func(c *Config) {
		c.Policies = fakePolicies{attachRequired: true}
		c.InUse = inUse
	})
	name := volume.PersistentName(testDriver, "h1")
	h.setPod("p1", pvSource("h1"))
	eventually(t, "volume reported as in use", func() bool {
		inUse.mu.Lock()
		defer inUse.mu.Unlock()
		return slices.Contains(inUse.set, name)
	})
	if calls := h.ops.history(); len(calls) != 0 {
		t.Fatalf("steps ran before the volume was in volumesInUse: %q", calls)
	}
	inUse.mu.Lock()
	inUse.reported[name] = true
	inUse.mu.Unlock()
	h.r.Reported([]volume.Name{name})
	h.waitCalls(t, "attach "+string(name), "stage "+string(name), "publish "+string(name)+"@p1")
}

func TestInlineVolumeIsPublishedWithoutStage(t *testing.T) {
	h := newHarness(t)
	close(h.synced)
	src := volume.Source{ID: volume.ID{Driver: testDriver, Handle: volume.InlineHandle("p1", "inline"), AccessType: volume.Filesystem}, Inline: true}
	name := volume.InlineName("p1", "inline")
	h.setPod("p1", src)
	h.waitCalls(t, "publish "+string(name)+"@p1")
	h.desired.DeletePod(types.UID("p1"))
	h.waitCalls(t, "publish "+string(name)+"@p1", "unpublish "+string(name)+"@p1")
}

func TestPodErrorIsTheCondition(t *testing.T) {
	h := newHarness(t)
	h.desired.SetPod(dsw.Pod{
		Info:   volume.PodInfo{UID: "p1", Namespace: "ns", Name: "p1"},
		Errors: []dsw.VolumeError{{SpecName: "data", Err: errors.Join(volume.ErrInvalidSpec, errors.New(`PVC "ns/data" is not bound`))}},
	})
	eventually(t, "InvalidVolumeSpec condition", func() bool {
		s, _ := h.status.get("p1")
		return s.Reason == status.ReasonInvalidVolumeSpec && strings.Contains(s.Message, "is not bound")
	})
}

func TestPolicyChangeWakesVolumeInBackoff(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Policies = fakePolicies{attachRequired: true}
		// Only an event can retry within the test.
		c.RetryBaseDelay, c.RetryMaxDelay = time.Hour, time.Hour
	})
	name := string(volume.PersistentName(testDriver, "h1"))
	h.ops.setFail("attach "+name, volume.ErrNotAttached)
	h.setPod("p1", pvSource("h1"))
	// Wait until the pod's key (which enqueues its unstaged volume) was
	// handled and every attach failure was handled: from then on the
	// volume waits out its backoff of an hour.
	podKey := volume.PodKey{Volume: volume.Name(name), Pod: "p1"}
	eventually(t, "failed attaches handled", func() bool {
		return h.seenCount(podKey) > 0 && h.seenCount(volume.Name(name)) == strings.Count(strings.Join(h.ops.history(), "\n"), "attach")
	})
	failed := len(h.ops.history())

	// E.g. the CSIDriver now says attachRequired=false.
	h.ops.setFail("attach "+name, nil)
	h.r.PolicyChanged(testDriver)
	eventually(t, "staged and published", func() bool {
		c := h.ops.history()
		return len(c) == failed+3 && slices.Equal(c[failed:], []string{"attach " + name, "stage " + name, "publish " + name + "@p1"})
	})
}

// TestVolumesInUseOnlyWhenAttachRequired: as the kubelet reports the
// volumes of attachable plugins only, volumesInUse holds the volume whose
// driver needs attach and not the one whose driver does not, while both
// are published; a policy change moves the second one in.
func TestVolumesInUseOnlyWhenAttachRequired(t *testing.T) {
	const noAttach = "noattach.csi.example.com"
	inUse := &fakeInUse{reported: map[volume.Name]bool{}}
	attached := volume.PersistentName(testDriver, "h1")
	free := volume.PersistentName(noAttach, "h2")
	inUse.reported[attached] = true
	policies := policyByDriver{testDriver: true}
	var mu sync.Mutex
	h := newHarness(t, func(c *Config) {
		c.InUse = inUse
		c.Policies = lockedPolicies{mu: &mu, p: policies}
	})
	h.drivers.mu.Lock()
	h.drivers.registered[noAttach] = true
	h.drivers.mu.Unlock()
	h.setPod("p1", pvSource("h1"), volume.Source{ID: volume.ID{Driver: noAttach, Handle: "h2", PVName: "pv-h2", AccessType: volume.Filesystem}})
	eventually(t, "p1 ready", func() bool { s, _ := h.status.get("p1"); return s.Ready })
	// volumesInUse is written apart from the pod's status: wait for the
	// attached volume in it, then look at both.
	var got []volume.Name
	eventually(t, "the attached volume in volumesInUse", func() bool {
		inUse.mu.Lock()
		defer inUse.mu.Unlock()
		got = slices.Clone(inUse.set)
		return slices.Contains(got, attached)
	})
	if !slices.Contains(got, attached) || slices.Contains(got, free) {
		t.Errorf("volumesInUse = %v, want %s and not %s", got, attached, free)
	}

	mu.Lock()
	policies[noAttach] = true
	mu.Unlock()
	h.r.PolicyChanged(noAttach)
	eventually(t, "the second volume reported after its driver needs attach", func() bool {
		inUse.mu.Lock()
		defer inUse.mu.Unlock()
		return slices.Contains(inUse.set, free) && slices.Contains(inUse.set, attached)
	})
}

// lockedPolicies guards a policyByDriver the test changes.
type lockedPolicies struct {
	mu *sync.Mutex
	p  policyByDriver
}

func (l lockedPolicies) Get(driver string) volume.Policy {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p.Get(driver)
}
