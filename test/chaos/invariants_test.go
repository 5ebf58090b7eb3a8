package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
)

// detectionTests names, for every invariant, the test that feeds the checker a violation of
// it (and its clean counterpart) and requires that it be found. TestEveryInvariantHasADetectionTest
// keeps it complete.
var detectionTests = map[Invariant]string{
	InvUnpublishLive:    "TestCheckerFindsEachJournalViolation/unpublish_of_a_live_pod",
	InvUnstageWanted:    "TestCheckerFindsEachJournalViolation/unstage_of_a_volume_a_pod_wants_since_long,_not_yet_published",
	InvUnstagePublished: "TestCheckerFindsEachJournalViolation/unstage_while_a_deleted_pod's_publish_is_uncertain",
	InvPublishUnstaged:  "TestCheckerFindsEachJournalViolation/publish_without_a_stage",
	InvDetachStaged:     "TestDetachOfAStagedVolumeIsFlagged",
	InvPathEscape:       "TestCheckerFindsEachJournalViolation/paths_that_are_not_the_layout's",
	InvLostUnstage:      "TestEndStateViolations",
	InvLeak:             "TestEndStateViolations",
	InvNotReady:         "TestSamplerNotReady",
	InvReadyUnmounted:   "TestSamplerReadyUnmounted",
	InvUnmountLive:      "TestUnmountOfALiveMountIsFlagged",
	InvCrash:            "TestAgentLogCrashes",
}

func TestEveryInvariantHasADetectionTest(t *testing.T) {
	for _, inv := range Invariants {
		if detectionTests[inv] == "" {
			t.Errorf("invariant %q has no detection test", inv)
		}
	}
	if len(detectionTests) != len(Invariants) {
		t.Errorf("%d detection tests for %d invariants", len(detectionTests), len(Invariants))
	}
}

// onlyViolations checks that the checker found exactly want (by invariant).
func onlyViolations(t *testing.T, c *Checker, want map[Invariant]int) {
	t.Helper()
	got := violationsOf(c)
	for _, inv := range Invariants {
		if got[inv] != want[inv] {
			t.Errorf("%s: %d violations, want %d; all: %+v", inv, got[inv], want[inv], c.Violations())
		}
	}
}

// TestDetachOfAStagedVolumeIsFlagged: the emulated attach/detach controller finds a volume the
// node does not report in use: detaching it is fine once the journal shows it unstaged; while
// the journal shows it staged, it is a violation of InvDetachStaged (once), and the volume is
// kept attached.
func TestDetachOfAStagedVolumeIsFlagged(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := VolKey{Driver: "d", Handle: "v"}
	unused := func() (bool, error) { return true, nil }
	for _, tc := range []struct {
		name        string
		journal     func(j *journal)
		stillUnused func() (bool, error)
		wantDetach  bool
		want        int
	}{
		{name: "unstaged: detach", journal: func(j *journal) {
			j.call("NodeStageVolume", "v", "/s", "", "OK")
			j.call("NodeUnstageVolume", "v", "/s", "", "OK")
		}, stillUnused: unused, wantDetach: true},
		{name: "never staged: detach", journal: func(*journal) {}, stillUnused: unused, wantDetach: true},
		{name: "staged and not in use: violation", journal: func(j *journal) {
			j.call("NodeStageVolume", "v", "/s", "", "OK")
		}, stillUnused: unused, want: 1},
		{name: "unstage in flight: violation", journal: func(j *journal) {
			j.call("NodeStageVolume", "v", "/s", "", "OK")
			j.call("NodeUnstageVolume", "v", "/s", "", "")
		}, stillUnused: unused, want: 1},
		{name: "staged, reported in use on the second look: no detach, no violation", journal: func(j *journal) {
			j.call("NodeStageVolume", "v", "/s", "", "OK")
		}, stillUnused: func() (bool, error) { return false, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(time.Second)
			c.AddVolume(Vol{Key: key, Stages: true, StagingPath: "/s"})
			tc.journal(newJournal(c, "d", t0))
			reported := map[VolKey]bool{}
			for range 2 { // reported once per episode
				ok, err := judgeDetach(c, key, tc.stillUnused, reported, t0)
				if err != nil || ok != tc.wantDetach {
					t.Fatalf("judgeDetach = %v, %v; want %v", ok, err, tc.wantDetach)
				}
			}
			onlyViolations(t, c, map[Invariant]int{InvDetachStaged: tc.want})
		})
	}
}

// TestEndStateViolations: a clean end state is no violation; each thing left is one.
func TestEndStateViolations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clean := func() endState {
		return endState{
			pluginVols: map[string][]plugin.Volume{"d": {{ID: "v1"}, {ID: "v2", Path: "/backing"}}},
			loops:      map[string][]string{"d": nil},
			podsLeft:   map[string]bool{},
		}
	}
	for _, tc := range []struct {
		name  string
		spoil func(e *endState)
		want  map[Invariant]int
	}{
		{name: "clean", spoil: func(*endState) {}},
		{name: "journal shows a stage", spoil: func(e *endState) { e.stillStaged = []string{"d^v1: staged at /s"} },
			want: map[Invariant]int{InvLostUnstage: 1}},
		{name: "plugin shows a stage", spoil: func(e *endState) { e.pluginVols["d"][0].Staged = &plugin.Staging{Path: "/s"} },
			want: map[Invariant]int{InvLostUnstage: 1}},
		{name: "plugin shows a publish", spoil: func(e *endState) {
			e.pluginVols["d"][0].Published = map[string]plugin.Publication{"/t": {}}
		}, want: map[Invariant]int{InvLeak: 1}},
		{name: "plugin shows an attachment", spoil: func(e *endState) {
			e.pluginVols["d"][1].Attachments = map[string]plugin.Attachment{"node": {}}
		}, want: map[Invariant]int{InvLeak: 1}},
		{name: "inline volume not deleted", spoil: func(e *endState) { e.pluginVols["d"][1].Ephemeral = true },
			want: map[Invariant]int{InvLeak: 1}},
		{name: "loop device", spoil: func(e *endState) { e.loops["d"] = []string{"loop7"} }, want: map[Invariant]int{InvLeak: 1}},
		{name: "mount", spoil: func(e *endState) { e.mounted = []string{"/root/pods/a/volumes/x/mount"} }, want: map[Invariant]int{InvLeak: 1}},
		{name: "pod left", spoil: func(e *endState) { e.podsLeft["p00001"] = true }, want: map[Invariant]int{InvLeak: 1}},
		{name: "file left", spoil: func(e *endState) { e.leftovers = []string{"pods/uid"} }, want: map[Invariant]int{InvLeak: 1}},
		{name: "end state unreadable", spoil: func(e *endState) { e.errs = []string{"walking the root: EIO"} }, want: map[Invariant]int{InvLeak: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(time.Second)
			e := clean()
			tc.spoil(&e)
			judgeEnd(c, e, t0)
			onlyViolations(t, c, tc.want)
		})
	}
}

// TestAgentLogCrashes: a panic, a fatal error or a race report in the agent's log is a
// violation of InvCrash; an ordinary log is not.
func TestAgentLogCrashes(t *testing.T) {
	ordinary := "I1127 02:00:00.000000 1 reconciler.go:100] NodePublishVolume ok\nE1127 02:00:01.000000 1 x.go:1] rpc error: code = Unavailable\n"
	for _, tc := range []struct {
		log  string
		want int
	}{
		{log: ordinary},
		{log: ordinary + "panic: runtime error: invalid memory address or nil pointer dereference\n", want: 1},
		{log: ordinary + "fatal error: concurrent map writes\n", want: 1},
		{log: ordinary + "==================\nWARNING: DATA RACE\nWrite at 0x00c000 by goroutine 7:\n", want: 1},
	} {
		c := NewChecker(time.Second)
		checkAgentLog(c, []byte(tc.log), time.Now())
		if got := violationsOf(c)[InvCrash]; got != tc.want || len(c.Violations()) != tc.want {
			t.Errorf("log %q: %+v, want %d crash violations", tc.log, c.Violations(), tc.want)
		}
	}
}

// TestUnmountOfALiveMountIsFlagged feeds the mount-table watch synthetic mountinfo snapshots:
// a mount of a live pod, or the staging mount of a volume a live pod wants, that leaves the
// table is a violation of InvUnmountLive; the same after the pod's deletion was issued, or
// before the agent could know of the pod, is not.
func TestUnmountOfALiveMountIsFlagged(t *testing.T) {
	const root = "/var/lib/kubelet"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fs, blk := VolKey{Driver: "d", Handle: "fs"}, VolKey{Driver: "d", Handle: "blk"}
	fsStaging := root + "/plugins/kubernetes.io/csi/d/h1/globalmount"
	blkStaging := root + "/plugins/kubernetes.io/csi/volumeDevices/staging/pv-blk"
	fsTarget := root + "/pods/a/volumes/kubernetes.io~csi/pv-fs/mount"
	fsSub := root + "/pods/a/volume-subpaths/pv-fs"
	blkTarget := root + "/plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/a"
	blkMap := root + "/plugins/kubernetes.io/csi/volumeDevices/pv-blk/dev/a"
	line := func(id int, mp string) string {
		return fmt.Sprintf("%d 1 0:%d / %s rw,relatime shared:1 - tmpfs tmpfs rw\n", id, id, mp)
	}
	lines := []string{line(20, "/"), line(21, root), line(22, fsStaging), line(23, blkStaging+"/device"), line(24, fsTarget),
		line(25, fsSub+"/c/0"), line(26, blkTarget), line(27, blkMap), line(28, "/elsewhere")}
	table := func(gone string) string {
		var out string
		for _, l := range lines {
			if mountPointOf(l) != gone {
				out += l
			}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		gone string
		// deleted: the pod's deletion was issued before the unmount; young: the pod was created
		// 1 s before it (the agent may not know it yet).
		deleted, young bool
		want           int
	}{
		{name: "filesystem target of a live pod", gone: fsTarget, want: 1},
		{name: "filesystem target of a deleted pod", gone: fsTarget, deleted: true},
		{name: "block target of a live pod", gone: blkTarget, want: 1},
		{name: "block map bind mount of a live pod (the agent's own)", gone: blkMap, want: 1},
		{name: "block map bind mount of a deleted pod", gone: blkMap, deleted: true},
		{name: "subPath mount of a live pod (the agent's own)", gone: fsSub + "/c/0", want: 1},
		{name: "subPath mount of a deleted pod", gone: fsSub + "/c/0", deleted: true},
		{name: "staging mount a live pod wants", gone: fsStaging, want: 1},
		{name: "block staging mount a live pod wants", gone: blkStaging + "/device", want: 1},
		{name: "staging mount of a deleted pod's volume", gone: fsStaging, deleted: true},
		{name: "staging mount a pod created a moment ago wants", gone: fsStaging, young: true},
		{name: "a mount outside the root", gone: "/elsewhere"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(5 * time.Second)
			c.AddVolume(Vol{Key: fs, Stages: true, StagingPath: fsStaging})
			c.AddVolume(Vol{Key: blk, Stages: true, StagingPath: blkStaging})
			created := t0
			if tc.young {
				created = t0.Add(9 * time.Second)
			}
			c.AddPod(Pod{UID: "a", Name: "a", Created: created, Volumes: []PodVolume{
				{Vol: fs, Target: fsTarget, SubPaths: fsSub}, {Vol: blk, Target: blkTarget, MapFile: blkMap}}})
			if tc.deleted {
				c.DeleteIssued("a", t0.Add(5*time.Second))
			}
			prev, err := parseMountInfo([]byte(table("")), root+"/")
			if err != nil {
				t.Fatal(err)
			}
			if len(prev) != 6 {
				t.Fatalf("mount points below the root: %v, want 6", sortedKeys(prev))
			}
			cur, err := parseMountInfo([]byte(table(tc.gone)), root+"/")
			if err != nil {
				t.Fatal(err)
			}
			for _, mp := range unmountedSince(prev, cur) {
				c.Unmounted(mp, t0.Add(10*time.Second))
			}
			onlyViolations(t, c, map[Invariant]int{InvUnmountLive: tc.want})
			if c.Unmounts() != 1 && tc.gone != "/elsewhere" {
				t.Errorf("%d unmounts counted, want 1", c.Unmounts())
			}
		})
	}
}

func mountPointOf(line string) string {
	var a, b, d, r, mp string
	_, _ = fmt.Sscan(line, &a, &b, &d, &r, &mp)
	return mp
}

func TestParseMountInfo(t *testing.T) {
	data := "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n" +
		"37 35 98:0 / /mnt/plain rw - ext3 /dev/root rw\n"
	got, err := parseMountInfo([]byte(data), "/mnt/")
	if err != nil || !got["/mnt/with space"] || !got["/mnt/plain"] || len(got) != 2 {
		t.Errorf("parseMountInfo = %v, %v", got, err)
	}
	if _, err := parseMountInfo([]byte("1 2 3\n"), "/"); err == nil {
		t.Error("a short line parsed")
	}
}

// TestTailSkipsAndReportsBadLines: a line that is not an entry is returned as such, and the
// entries after it are read all the same.
func TestTailSkipsAndReportsBadLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.jsonl")
	data := `{"pid":1,"seq":1,"event":"begin","method":"NodeStageVolume"}` + "\nnot json\n" +
		`{"pid":1,"seq":1,"event":"end","method":"NodeStageVolume","code":"OK"}` + "\n" + `{"pid":1,"se`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	tl := newTail(path)
	entries, bad, err := tl.Read()
	if err != nil || len(entries) != 2 || len(bad) != 1 {
		t.Fatalf("Read = %d entries, bad %q, %v; want 2 entries and 1 bad line", len(entries), bad, err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`q":2,"event":"begin"}` + "\n"); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if entries, bad, err := tl.Read(); err != nil || len(entries) != 1 || len(bad) != 0 || entries[0].Seq != 2 {
		t.Errorf("second Read = %+v, %q, %v; want the completed entry", entries, bad, err)
	}
}

// TestReportFailsOnEveryErrorOfTheRun: a run without violations fails all the same on a nemesis
// error, an unparsed journal line, a failed journal read, a sampler error, a failed drain or a
// nemesis not converged.
func TestReportFailsOnEveryErrorOfTheRun(t *testing.T) {
	if r := (&Report{}); !r.Passed() {
		t.Fatalf("a clean report does not pass: %v", r.Failures())
	}
	for name, r := range map[string]*Report{
		"nemesis error":   {NemesisErrors: map[string]int{NemesisPluginKill: 1}},
		"not converged":   {NotConv: map[string]int{NemesisDiskFull: 1}},
		"unparsed line":   {UnparsedLines: 1},
		"journal read":    {JournalErrors: 1},
		"sampler error":   {SamplerErrors: 1},
		"drain":           {DrainError: "not converged within 5m0s: 1 pods left"},
		"violation":       {Violations: []Violation{{Invariant: InvLeak}}},
		"interrupted run": {Interrupted: true},
	} {
		if r.Passed() {
			t.Errorf("%s: the report passes", name)
		}
	}
}

// timeline drives a sampler over one pod with fake samples every 500 ms.
type timeline struct {
	t   *testing.T
	h   *Harness
	s   *sampler
	p   *workloadPod
	t0  time.Time
	now time.Duration
}

func newTimeline(t *testing.T) *timeline {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &Harness{
		cfg:     Config{ReadyBound: 30 * time.Second, ReadyGrace: 5 * time.Second},
		checker: NewChecker(5 * time.Second),
		pods:    newPodSet(),
		vols:    &volumePool{byKey: map[VolKey]*poolVolume{}, users: map[VolKey]int{}},
	}
	p := &workloadPod{name: "p00001", uid: "uid-1", created: t0, drivers: []string{"d"},
		targets: []string{"/root/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount", "/root/plugins/kubernetes.io/csi/volumeDevices/publish/pv-2/uid-1"}}
	h.pods.byID[p.uid] = p
	return &timeline{t: t, h: h, s: newSampler(h), p: p, t0: t0}
}

// state is what the samples show from now on.
type state struct {
	ready, mounted, agentDown, apiDown, recovering bool
	// halfMounted: only the first target is mounted.
	halfMounted bool
	faulted     string
}

// run samples every 500 ms for d in state st.
func (tl *timeline) run(d time.Duration, st state) {
	for end := tl.now + d; tl.now < end; {
		tl.now += 500 * time.Millisecond
		smp := sample{at: tl.t0.Add(tl.now), agentReady: !st.agentDown, apiUp: !st.apiDown, recovering: st.recovering,
			ready: map[types.UID]bool{}, present: map[types.UID]bool{tl.p.uid: true}, mounted: map[string]bool{}, faulted: map[string]bool{}}
		if st.ready {
			smp.ready[tl.p.uid] = true
		}
		for i, tg := range tl.p.targets {
			if st.mounted || (st.halfMounted && i == 0) {
				smp.mounted[tg] = true
			}
		}
		if st.faulted != "" {
			smp.faulted[st.faulted] = true
		}
		tl.s.check(smp)
	}
}

// deleteNow marks the pod as being deleted.
func (tl *timeline) deleteNow() {
	tl.h.pods.mu.Lock()
	defer tl.h.pods.mu.Unlock()
	tl.p.deleteIssued = tl.t0.Add(tl.now)
}

// TestSamplerNotReady: a live pod must be VolumesReady=True within 30 s of healthy time from
// its creation (or from when it was last seen ready), whatever is mounted.
func TestSamplerNotReady(t *testing.T) {
	up := state{ready: true, mounted: true}
	for _, tc := range []struct {
		name string
		run  func(tl *timeline)
		want int
	}{
		{name: "ready after 2 s, for 60 s", run: func(tl *timeline) {
			tl.run(2*time.Second, state{})
			tl.run(58*time.Second, up)
		}},
		{name: "an agent that mounts nothing and reports nothing", run: func(tl *timeline) {
			tl.run(40*time.Second, state{})
		}, want: 1},
		{name: "volumes mounted, never ready", run: func(tl *timeline) {
			tl.run(40*time.Second, state{mounted: true})
		}, want: 1},
		{name: "not ready 40 s, 20 s of them with the agent down", run: func(tl *timeline) {
			tl.run(10*time.Second, state{})
			tl.run(20*time.Second, state{agentDown: true})
			tl.run(10*time.Second, state{})
			tl.run(20*time.Second, up)
		}},
		{name: "not ready 40 s, 20 s of them with the API server down", run: func(tl *timeline) {
			tl.run(10*time.Second, state{})
			tl.run(20*time.Second, state{apiDown: true})
			tl.run(10*time.Second, state{})
			tl.run(20*time.Second, up)
		}},
		{name: "not ready 40 s, 20 s of them just after an API server outage", run: func(tl *timeline) {
			tl.run(10*time.Second, state{apiDown: true})
			tl.run(20*time.Second, state{recovering: true})
			tl.run(20*time.Second, state{})
			tl.run(20*time.Second, up)
		}},
		{name: "not ready 40 s, 20 s of them with the pod's plugin faulted", run: func(tl *timeline) {
			tl.run(10*time.Second, state{})
			tl.run(20*time.Second, state{faulted: "d"})
			tl.run(10*time.Second, state{})
			tl.run(20*time.Second, up)
		}},
		{name: "not ready 40 s, 20 s of them with the disk full", run: func(tl *timeline) {
			tl.run(10*time.Second, state{})
			tl.run(20*time.Second, state{faulted: nodeFault})
			tl.run(10*time.Second, state{})
		}},
		{name: "not ready 40 s while another plugin is faulted", run: func(tl *timeline) {
			tl.run(40*time.Second, state{faulted: "other"})
		}, want: 1},
		{name: "deleted after 20 s, never ready", run: func(tl *timeline) {
			tl.run(20*time.Second, state{})
			tl.deleteNow()
			tl.run(40*time.Second, state{})
		}},
		{name: "ready, then not ready again for 35 s", run: func(tl *timeline) {
			tl.run(2*time.Second, state{})
			tl.run(10*time.Second, up)
			tl.run(35*time.Second, state{mounted: true})
		}, want: 1},
		{name: "ready, then not ready again for 25 s", run: func(tl *timeline) {
			tl.run(2*time.Second, state{})
			tl.run(10*time.Second, up)
			tl.run(25*time.Second, state{mounted: true})
			tl.run(10*time.Second, up)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTimeline(t)
			tc.run(tl)
			onlyViolations(t, tl.h.checker, map[Invariant]int{InvNotReady: tc.want})
		})
	}
}

// TestSamplerReadyUnmounted: a live pod VolumesReady=True while one of its targets is not in
// the mount table for more than 5 s of healthy time is a violation.
func TestSamplerReadyUnmounted(t *testing.T) {
	up := state{ready: true, mounted: true}
	for _, tc := range []struct {
		name string
		run  func(tl *timeline)
		want int
	}{
		{name: "ready with its targets mounted", run: func(tl *timeline) {
			tl.run(time.Second, state{})
			tl.run(30*time.Second, up)
		}},
		{name: "ready with nothing mounted (an agent that mounted nothing)", run: func(tl *timeline) {
			tl.run(10*time.Second, state{ready: true})
		}, want: 1},
		{name: "ready with a block target not mounted", run: func(tl *timeline) {
			tl.run(10*time.Second, state{ready: true, halfMounted: true})
		}, want: 1},
		{name: "a mount lost, the condition follows within the grace", run: func(tl *timeline) {
			tl.run(10*time.Second, up)
			tl.run(3*time.Second, state{ready: true, halfMounted: true})
			tl.run(10*time.Second, state{halfMounted: true})
			tl.run(10*time.Second, up)
		}},
		{name: "a mount lost while the plugin is faulted, repaired after", run: func(tl *timeline) {
			tl.run(10*time.Second, up)
			tl.run(20*time.Second, state{ready: true, halfMounted: true, faulted: "d"})
			tl.run(3*time.Second, state{ready: true, halfMounted: true})
			tl.run(10*time.Second, up)
		}},
		{name: "a mount lost, the pod stays ready", run: func(tl *timeline) {
			tl.run(10*time.Second, up)
			tl.run(20*time.Second, state{ready: true, halfMounted: true})
		}, want: 1},
		{name: "deleted: targets go before the condition", run: func(tl *timeline) {
			tl.run(10*time.Second, up)
			tl.deleteNow()
			tl.run(20*time.Second, state{ready: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := newTimeline(t)
			tc.run(tl)
			onlyViolations(t, tl.h.checker, map[Invariant]int{InvReadyUnmounted: tc.want})
		})
	}
}

// TestConvergenceRequiresTeardownAndReadiness: after a nemesis, the node has converged only
// when the pods live at its end and still live are ready with their targets mounted, and the
// pods deleted by then or since — gone from the API server or not — have no target mounted.
func TestConvergenceRequiresTeardownAndReadiness(t *testing.T) {
	tl := newTimeline(t)
	h := tl.h
	q := &workloadPod{name: "p00002", uid: "uid-2", created: tl.t0, targets: []string{"/root/pods/uid-2/volumes/kubernetes.io~csi/pv-3/mount"}}
	h.pods.byID[q.uid] = q
	// r is being deleted when the nemesis ends.
	r := &workloadPod{name: "p00003", uid: "uid-3", created: tl.t0, deleteIssued: tl.t0, lastDelete: tl.t0,
		targets: []string{"/root/pods/uid-3/volumes/kubernetes.io~csi/pv-4/mount"}}
	h.pods.byID[r.uid] = r
	done := tl.s.await("test")
	at := tl.t0.Add(time.Second)
	smp := func(ready map[types.UID]bool, mounted ...string) sample {
		s := sample{at: at, agentReady: true, apiUp: true, ready: ready,
			present: map[types.UID]bool{tl.p.uid: true}, mounted: map[string]bool{}, faulted: map[string]bool{}}
		for _, m := range mounted {
			s.mounted[m] = true
		}
		return s
	}
	converged := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	// q was deleted with grace period 0 since: gone from the API server, still mounted.
	h.pods.mu.Lock()
	q.deleteIssued = tl.t0.Add(time.Second)
	h.pods.mu.Unlock()
	tl.s.check(smp(map[types.UID]bool{tl.p.uid: true}, append(slices.Clone(tl.p.targets), q.targets[0])...))
	if converged() {
		t.Fatal("converged while a pod deleted since is still mounted")
	}
	tl.s.check(smp(map[types.UID]bool{}, tl.p.targets...))
	if converged() {
		t.Fatal("converged while a live pod is not ready")
	}
	tl.s.check(smp(map[types.UID]bool{tl.p.uid: true}, tl.p.targets[0]))
	if converged() {
		t.Fatal("converged while a live pod's target is not mounted")
	}
	tl.s.check(smp(map[types.UID]bool{tl.p.uid: true}, append(slices.Clone(tl.p.targets), r.targets[0])...))
	if converged() {
		t.Fatal("converged while a pod deleted before the end of the nemesis (gone since) is still mounted")
	}
	tl.s.check(smp(map[types.UID]bool{tl.p.uid: true}, tl.p.targets...))
	if !converged() {
		t.Fatalf("not converged: %s", tl.s.lastUnsettled())
	}
}
