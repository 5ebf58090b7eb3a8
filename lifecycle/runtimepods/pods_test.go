package runtimepods

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	testclock "k8s.io/utils/clock/testing"
)

// fakeStates is the desired and actual states as two sets.
type fakeStates struct {
	mu        sync.Mutex
	wanted    map[types.UID]bool
	published map[types.UID]bool
}

func (s *fakeStates) Wanted(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wanted[uid]
}

func (s *fakeStates) Published(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.published[uid]
}

func (s *fakeStates) Unwanted() []types.UID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []types.UID
	for uid := range s.published {
		if !s.wanted[uid] {
			out = append(out, uid)
		}
	}
	return out
}

var _ States = &fakeStates{}

type env struct {
	t        *testing.T
	states   *fakeStates
	clock    *testclock.FakePassiveClock
	synced   bool
	pods     *Pods
	mu       sync.Mutex
	releases []types.UID
	logs     ktesting.Underlier
}

func newEnv(t *testing.T) *env {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	e := &env{
		t:      t,
		states: &fakeStates{wanted: map[types.UID]bool{}, published: map[types.UID]bool{}},
		clock:  testclock.NewFakePassiveClock(time.Now()),
		synced: true,
		logs:   logger.GetSink().(ktesting.Underlier),
	}
	var err error
	e.pods, err = New(Config{
		States: e.states, Synced: func() bool { return e.synced }, Clock: e.clock, Logger: logger,
		OnRelease: func(uid types.UID) {
			e.mu.Lock()
			e.releases = append(e.releases, uid)
			e.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// runs puts a published pod in the desired state.
func (e *env) runs(uid types.UID) {
	e.states.mu.Lock()
	e.states.wanted[uid], e.states.published[uid] = true, true
	e.states.mu.Unlock()
	e.pods.podChanged(uid)
}

// leaves takes a pod out of the desired state, as a force delete does.
func (e *env) leaves(uid types.UID) {
	e.states.mu.Lock()
	delete(e.states.wanted, uid)
	e.states.mu.Unlock()
	e.pods.podChanged(uid)
}

// unpublished records the teardown of the pod's volumes.
func (e *env) unpublished(uid types.UID) {
	e.states.mu.Lock()
	delete(e.states.published, uid)
	e.states.mu.Unlock()
}

func (e *env) wantHeld(uid types.UID, reason string) {
	e.t.Helper()
	got, held := e.pods.Held(uid)
	if !held || got != reason {
		e.t.Fatalf("Held(%s) = %q, %v; want held: %q", uid, got, held, reason)
	}
	if got, waiting := e.pods.Waiting(uid); !waiting || got != reason {
		e.t.Fatalf("Waiting(%s) = %q, %v; want %q", uid, got, waiting, reason)
	}
}

func (e *env) wantReleased(uid types.UID) {
	e.t.Helper()
	if reason, held := e.pods.Held(uid); held {
		e.t.Fatalf("Held(%s) = %q, want released", uid, reason)
	}
	if _, waiting := e.pods.Waiting(uid); waiting {
		e.t.Fatalf("Waiting(%s) = true, want released", uid)
	}
}

func (e *env) released() []types.UID {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := slices.Clone(e.releases)
	slices.Sort(out)
	return out
}

func TestWantedPodsAreNeverHeld(t *testing.T) {
	e := newEnv(t)
	e.runs("a")
	e.wantReleased("a")
	if n := e.pods.Awaiting(); n != 0 {
		t.Errorf("Awaiting = %d, want 0", n)
	}
}

func TestForceDeletedPodIsHeldUntilContainersStopped(t *testing.T) {
	e := newEnv(t)
	e.runs("a")
	e.leaves("a")
	e.wantHeld("a", ReasonLeftAPIServer)
	e.wantHeld("a", ReasonLeftAPIServer)
	if n := e.pods.Awaiting(); n != 1 {
		t.Errorf("Awaiting = %d, want 1", n)
	}
	if n := strings.Count(e.logs.GetBuffer().String(), "Keeping the pod's volumes"); n != 1 {
		t.Errorf("the hold was logged %d times, want once:\n%s", n, e.logs.GetBuffer().String())
	}
	e.pods.ContainersStopped("a")
	e.wantReleased("a")
	if got := e.released(); !slices.Equal(got, []types.UID{"a"}) {
		t.Errorf("OnRelease got %v, want [a]", got)
	}
	if n := e.pods.Awaiting(); n != 0 {
		t.Errorf("Awaiting = %d after the release, want 0", n)
	}
}

func TestSignalForAPodNotSeenYetReleasesIt(t *testing.T) {
	// The runtime's word counts whatever the API server says: a pod found
	// on disk, which the API server never showed, is released by it.
	e := newEnv(t)
	e.states.published["disk"] = true
	e.pods.ContainersStopped("disk")
	e.wantReleased("disk")
}

func TestRunningPodsReleasesOnlyAReportAfterThePodLeft(t *testing.T) {
	e := newEnv(t)
	e.runs("a")
	e.runs("b")
	// A report without a (its containers not started yet) while a is
	// still wanted releases nothing.
	e.pods.Running([]types.UID{"b"})
	e.leaves("a")
	e.leaves("b")
	e.wantHeld("a", ReasonLeftAPIServer)
	e.wantHeld("b", ReasonLeftAPIServer)
	if got := e.released(); len(got) != 0 {
		t.Fatalf("released %v by a report older than their leaving", got)
	}
	// A report that still has both keeps both.
	e.pods.Running([]types.UID{"a", "b"})
	e.wantHeld("a", ReasonLeftAPIServer)
	e.wantHeld("b", ReasonLeftAPIServer)
	// One without a releases a, and only a.
	e.pods.Running([]types.UID{"b"})
	if got := e.released(); !slices.Equal(got, []types.UID{"a"}) {
		t.Fatalf("released %v, want [a]", got)
	}
	e.wantReleased("a")
	e.wantHeld("b", ReasonLeftAPIServer)
	// An empty report: the runtime runs nothing.
	e.pods.Running([]types.UID{})
	e.wantReleased("b")
}

func TestPodFoundOnDiskIsHeldUntilAnyReport(t *testing.T) {
	e := newEnv(t)
	e.states.published["disk"] = true
	e.wantHeld("disk", ReasonFoundOnDisk)
	e.pods.Running([]types.UID{"disk"})
	e.wantHeld("disk", ReasonFoundOnDisk)
	e.pods.Running(nil)
	e.wantReleased("disk")
	if got := e.released(); !slices.Equal(got, []types.UID{"disk"}) {
		t.Errorf("OnRelease got %v, want [disk]", got)
	}
}

func TestReportBeforeTheDesiredStateSyncedCountsAfterwards(t *testing.T) {
	e := newEnv(t)
	e.synced = false
	e.states.published["disk"] = true
	e.pods.Running(nil)
	if got := e.released(); len(got) != 0 {
		t.Fatalf("released %v before the desired state synced", got)
	}
	if _, held := e.pods.Held("disk"); !held {
		t.Fatal("not held before the desired state synced")
	}
	if n := e.pods.Awaiting(); n != 0 {
		t.Errorf("Awaiting = %d before the desired state synced, want 0", n)
	}
	e.synced = true
	e.wantReleased("disk")
	if got := e.released(); !slices.Equal(got, []types.UID{"disk"}) {
		t.Errorf("OnRelease got %v, want [disk]", got)
	}
}

func TestTerminalPhaseReleases(t *testing.T) {
	e := newEnv(t)
	e.runs("a")
	e.pods.Terminal("a")
	e.leaves("a")
	e.wantReleased("a")
}

func TestRecordsArePrunedOnceNothingIsLeft(t *testing.T) {
	e := newEnv(t)
	// Many pods come and go without a word from the runtime.
	for i := range 3 * minPruneAt {
		uid := types.UID(strings.Repeat("x", i+1))
		e.runs(uid)
		e.leaves(uid)
		e.pods.ContainersStopped(uid)
		e.unpublished(uid)
		if i == minPruneAt {
			e.clock.SetTime(e.clock.Now().Add(pruneAfter))
		}
	}
	// Held pods are kept whatever their age.
	e.runs("held")
	e.leaves("held")
	e.wantHeld("held", ReasonLeftAPIServer)
	e.clock.SetTime(e.clock.Now().Add(pruneAfter))
	e.pods.Running([]types.UID{"held"})
	if n := e.pods.Len(); n != 1 {
		t.Errorf("%d records after the pods went, want 1 (the held pod)", n)
	}
	e.wantHeld("held", ReasonLeftAPIServer)
}

// TestReportListedBeforeThePodLeftDoesNotReleaseIt: a report the runtime
// listed (Mark) before the pod left the desired state — the pod may have
// started after the list was taken — does not release it, however late it
// arrives; a report listed after the leaving does.
func TestReportListedBeforeThePodLeftDoesNotReleaseIt(t *testing.T) {
	e := newEnv(t)
	mark := e.pods.Mark() // the runtime starts listing: p does not run yet
	e.runs("p")
	e.leaves("p")
	e.pods.RunningAsOf(mark, []types.UID{})
	e.wantHeld("p", ReasonLeftAPIServer)
	if got := e.released(); len(got) != 0 {
		t.Fatalf("released %v by a list taken before the pod left", got)
	}
	// An older report arriving later changes nothing either.
	e.pods.RunningAsOf(e.pods.Mark(), []types.UID{"p"})
	e.pods.RunningAsOf(mark, []types.UID{})
	e.wantHeld("p", ReasonLeftAPIServer)
	e.pods.RunningAsOf(e.pods.Mark(), []types.UID{})
	e.wantReleased("p")
}

// TestPodLeavingBeforeItsHandlerRanIsHeld: between the desired state's
// change and its handler, a pod that was wanted in this run is not taken
// for one found on disk: a report does not release it.
func TestPodLeavingBeforeItsHandlerRanIsHeld(t *testing.T) {
	e := newEnv(t)
	e.runs("p")
	e.pods.Running([]types.UID{})
	// The desired state dropped p; its handler has not run yet.
	e.states.mu.Lock()
	delete(e.states.wanted, "p")
	e.states.mu.Unlock()
	if reason, held := e.pods.Held("p"); !held {
		t.Fatalf("Held(p) = %q, released: a report taken while p was wanted released it as a pod found on disk", reason)
	}
	e.pods.Running([]types.UID{})
	if got := e.released(); len(got) != 0 {
		t.Fatalf("released %v before the pod's leaving was recorded", got)
	}
	e.pods.podChanged("p")
	e.wantHeld("p", ReasonLeftAPIServer)
	e.pods.Running([]types.UID{})
	e.wantReleased("p")
}
