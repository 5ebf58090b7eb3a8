package chaos

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// journal writes entries of one plugin process for a checker test.
type journal struct {
	c      *Checker
	driver string
	pid    int
	seq    uint64
	now    time.Time
}

func newJournal(c *Checker, driver string, start time.Time) *journal {
	j := &journal{c: c, driver: driver, pid: 100, now: start}
	j.c.Entry(driver, plugin.Entry{PID: j.pid, Event: plugin.EventStart, Time: j.now})
	return j
}

// at moves the journal's clock to d after t0.
func (j *journal) at(t0 time.Time, d time.Duration) *journal {
	j.now = t0.Add(d)
	return j
}

// call writes a call's begin and, unless code is "", its end.
func (j *journal) call(method, volumeID, staging, target, code string) {
	j.seq++
	j.c.Entry(j.driver, plugin.Entry{PID: j.pid, Seq: j.seq, Event: plugin.EventBegin, Time: j.now,
		Method: method, VolumeID: volumeID, StagingPath: staging, TargetPath: target})
	if code != "" {
		j.c.Entry(j.driver, plugin.Entry{PID: j.pid, Seq: j.seq, Event: plugin.EventEnd, Time: j.now.Add(time.Millisecond),
			Method: method, VolumeID: volumeID, Code: code})
	}
}

// restart writes the start of a new plugin process.
func (j *journal) restart() {
	j.pid++
	j.seq = 0
	j.c.Entry(j.driver, plugin.Entry{PID: j.pid, Event: plugin.EventStart, Time: j.now})
}

func violationsOf(c *Checker) map[Invariant]int {
	out := map[Invariant]int{}
	for _, v := range c.Violations() {
		out[v.Invariant]++
	}
	return out
}

// TestCheckerFindsEachJournalViolation feeds the checker journals with and without a violation
// of each invariant it decides from the journal, and checks that it finds exactly those.
func TestCheckerFindsEachJournalViolation(t *testing.T) {
	const (
		driver  = "d"
		handle  = "vol-1"
		staging = "/root/plugins/kubernetes.io/csi/d/h/globalmount"
		targetA = "/root/pods/a/volumes/kubernetes.io~csi/pv-1/mount"
		targetB = "/root/pods/b/volumes/kubernetes.io~csi/pv-1/mount"
	)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := time.Second
	key := VolKey{Driver: driver, Handle: handle}
	podA := Pod{UID: "a", Name: "a", Created: t0, Volumes: []PodVolume{{Vol: key, Target: targetA}}}
	podB := Pod{UID: "b", Name: "b", Created: t0, Volumes: []PodVolume{{Vol: key, Target: targetB}}}
	tests := []struct {
		name string
		// run writes the journal; podA (and podB when two) were created at t0.
		run  func(c *Checker, j *journal)
		two  bool
		want map[Invariant]int
	}{{
		name: "a correct lifecycle",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 2*s).call("NodePublishVolume", handle, staging, targetA, "OK")
			c.DeleteIssued("a", t0.Add(3*s))
			j.at(t0, 4*s).call("NodeUnpublishVolume", handle, "", targetA, "OK")
			j.at(t0, 5*s).call("NodeUnstageVolume", handle, staging, "", "OK")
		},
	}, {
		name: "unpublish of a live pod",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 2*s).call("NodePublishVolume", handle, staging, targetA, "OK")
			j.at(t0, 3*s).call("NodeUnpublishVolume", handle, "", targetA, "OK")
			c.DeleteIssued("a", t0.Add(4*s))
		},
		want: map[Invariant]int{InvUnpublishLive: 1},
	}, {
		name: "unstage while published for a live pod",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 2*s).call("NodePublishVolume", handle, staging, targetA, "OK")
			j.at(t0, 3*s).call("NodeUnstageVolume", handle, staging, "", "FailedPrecondition")
		},
		want: map[Invariant]int{InvUnstagePublished: 1, InvUnstageWanted: 1},
	}, {
		name: "unstage while a deleted pod's publish is uncertain",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 2*s).call("NodePublishVolume", handle, staging, targetA, "OK")
			c.DeleteIssued("a", t0.Add(3*s))
			j.at(t0, 4*s).call("NodeUnpublishVolume", handle, "", targetA, "") // the plugin dies in it
			j.restart()
			j.at(t0, 6*s).call("NodeUnstageVolume", handle, staging, "", "OK")
		},
		want: map[Invariant]int{InvUnstagePublished: 1},
	}, {
		name: "unstage of a volume a pod wants since long, not yet published",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 10*s).call("NodeUnstageVolume", handle, staging, "", "OK")
		},
		want: map[Invariant]int{InvUnstageWanted: 1},
	}, {
		name: "unstage before the agent could know the new pod",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 2*s).call("NodeUnstageVolume", handle, staging, "", "OK")
		},
	}, {
		name: "unstage of a wanted volume while an API server outage hid the pod",
		run: func(c *Checker, j *journal) {
			c.APIDown(t0.Add(s))
			c.APIUp(t0.Add(8 * s))
			j.at(t0, 9*s).call("NodeUnstageVolume", handle, staging, "", "OK")
		},
	}, {
		name: "publish without a stage",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodePublishVolume", handle, staging, targetA, "FailedPrecondition")
		},
		want: map[Invariant]int{InvPublishUnstaged: 1},
	}, {
		name: "publish after a failed stage",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "Internal")
			j.at(t0, 2*s).call("NodePublishVolume", handle, staging, targetA, "FailedPrecondition")
		},
		want: map[Invariant]int{InvPublishUnstaged: 1},
	}, {
		name: "publish after an interrupted unstage without a new stage",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 2*s).call("NodeUnstageVolume", handle, staging, "", "")
			j.restart()
			j.at(t0, 3*s).call("NodePublishVolume", handle, staging, targetA, "OK")
		},
		want: map[Invariant]int{InvPublishUnstaged: 1, InvUnstageWanted: 0},
	}, {
		name: "publish after an interrupted unstage and a new stage",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 2*s).call("NodeUnstageVolume", handle, staging, "", "")
			j.restart()
			j.at(t0, 3*s).call("NodeStageVolume", handle, staging, "", "OK")
			j.at(t0, 4*s).call("NodePublishVolume", handle, staging, targetA, "OK")
		},
	}, {
		name: "paths that are not the layout's",
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", handle, "/elsewhere", "", "OK")
			j.at(t0, 2*s).call("NodePublishVolume", handle, "/elsewhere", targetA, "OK")
		},
		want: map[Invariant]int{InvPathEscape: 2},
	}, {
		name: "a target of the other pod's volume",
		two:  true,
		run: func(c *Checker, j *journal) {
			j.at(t0, s).call("NodeStageVolume", "vol-2", "", "", "OK")
			j.at(t0, 2*s).call("NodePublishVolume", "vol-2", "", targetB, "OK")
		},
		want: map[Invariant]int{InvPathEscape: 1},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(5 * time.Second)
			c.AddVolume(Vol{Key: key, Stages: true, StagingPath: staging})
			c.AddVolume(Vol{Key: VolKey{Driver: driver, Handle: "vol-2"}})
			c.AddPod(podA)
			if tc.two {
				b := podB
				b.Volumes = []PodVolume{{Vol: key, Target: targetB}}
				c.AddPod(b)
			}
			tc.run(c, newJournal(c, driver, t0))
			c.Finish()
			got := violationsOf(c)
			for _, inv := range Invariants {
				if got[inv] != tc.want[inv] {
					t.Errorf("%s: %d violations, want %d; all: %+v", inv, got[inv], tc.want[inv], c.Violations())
				}
			}
		})
	}
}

// TestCheckerWaitsForThePodOfATarget: a publish whose pod the workload records only later is
// checked then; one whose target no pod ever had is a violation at Finish.
func TestCheckerWaitsForThePodOfATarget(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := VolKey{Driver: "d", Handle: "csi-1"}
	c := NewChecker(5 * time.Second)
	c.AddVolume(Vol{Key: key})
	j := newJournal(c, "d", t0)
	j.at(t0, time.Second).call("NodePublishVolume", "csi-1", "", "/root/pods/late/volumes/kubernetes.io~csi/i/mount", "OK")
	j.at(t0, 2*time.Second).call("NodePublishVolume", "csi-1", "", "/root/pods/nobody/volumes/kubernetes.io~csi/i/mount", "OK")
	j.at(t0, 3*time.Second).call("NodeUnpublishVolume", "csi-1", "", "/root/pods/late/volumes/kubernetes.io~csi/i/mount", "OK")
	if v := c.Violations(); len(v) != 0 {
		t.Fatalf("violations before the pods are known: %+v", v)
	}
	c.AddPod(Pod{UID: "late", Name: "late", Created: t0, Volumes: []PodVolume{{Vol: key, Target: "/root/pods/late/volumes/kubernetes.io~csi/i/mount"}}})
	if got := violationsOf(c); got[InvUnpublishLive] != 1 || len(c.Violations()) != 1 {
		t.Errorf("after the late pod was recorded: %+v, want one unpublish of a live pod", c.Violations())
	}
	c.Finish()
	if got := violationsOf(c); got[InvPathEscape] != 1 {
		t.Errorf("after Finish: %+v, want the target nobody had reported", c.Violations())
	}
}

// TestCheckerStaged reports what holds a volume on the node.
func TestCheckerStaged(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := VolKey{Driver: "d", Handle: "v"}
	c := NewChecker(time.Second)
	c.AddVolume(Vol{Key: key, Stages: true, StagingPath: "/s"})
	j := newJournal(c, "d", t0)
	check := func(want bool, what string) {
		t.Helper()
		if held, why := c.Staged(key); held != want {
			t.Errorf("%s: Staged = %v (%s), want %v", what, held, why, want)
		}
	}
	check(false, "at first")
	j.call("NodeStageVolume", "v", "/s", "", "")
	check(true, "stage in flight")
	j.restart()
	check(true, "stage interrupted")
	j.call("NodeUnstageVolume", "v", "/s", "", "OK")
	check(false, "unstaged")
	j.call("NodeStageVolume", "v", "/s", "", "OK")
	check(true, "staged")
	if got := c.StillStaged(); len(got) != 1 {
		t.Errorf("StillStaged = %v, want the one volume", got)
	}
}

// TestLeftovers lists what a run left in the root and nothing of the skeleton.
func TestLeftovers(t *testing.T) {
	root := t.TempDir()
	layout, err := paths.New(root)
	if err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(root, "plugins_registry")
	for _, d := range []string{
		reg, layout.PodsDir(), filepath.Join(layout.PluginDir(), "d.example.com"),
		filepath.Join(layout.PluginDir(), "volumeDevices", "staging"), filepath.Join(layout.PluginDir(), "volumeDevices", "publish"),
	} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(reg, "d-reg.sock"), filepath.Join(root, "csi-volmgr.lock"), filepath.Join(root, "csi-volmgr.sock")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := leftovers(layout, reg); err != nil || len(got) != 0 {
		t.Fatalf("leftovers of an empty root = %v, %v; want none", got, err)
	}
	record := filepath.Join(layout.PluginDir(), "d.example.com", "abc", "vol_data.json")
	pod := filepath.Join(layout.PodsDir(), "uid", "volumes")
	for _, d := range []string{filepath.Dir(record), pod} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(record, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := leftovers(layout, reg)
	want := []string{"plugins/kubernetes.io/csi/d.example.com/abc", "pods/uid"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("leftovers = %v, %v; want %v", got, err, want)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond} {
		if got := percentile(ds, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v", got)
	}
}
