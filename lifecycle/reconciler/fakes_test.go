package reconciler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/dsw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/status"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const testDriver = "test.csi.example.com"

// fakeOps stands in for lifecycle/operations: it records each call and the
// outcome operations would record in the (real) actual state.
type fakeOps struct {
	world *asw.World
	mu    sync.Mutex
	calls []string
	// fail maps a call ("stage <volume>", "publish <volume>@<pod>", ...) to
	// the error it returns.
	fail map[string]error
	// hold maps a call to a channel it waits on (or on its context) before
	// it returns, as a long step still running.
	hold map[string]chan struct{}
}

var _ Operations = &fakeOps{}

func id(src volume.Source) volume.ID {
	return volume.ID{Driver: src.Driver, Handle: src.Handle, PVName: src.PVName, AccessType: src.AccessType}
}

func (f *fakeOps) record(call string) error {
	_, err := f.recordCall(call)
	return err
}

func (f *fakeOps) recordCall(call string) (held chan struct{}, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	return f.hold[call], f.fail[call]
}

// recordHeld records call and, when the call is held, waits until it is
// released or ctx ends.
func (f *fakeOps) recordHeld(ctx context.Context, call string) error {
	held, err := f.recordCall(call)
	if held == nil {
		return err
	}
	select {
	case <-held:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setHold makes call wait until the returned release is called.
func (f *fakeOps) setHold(call string) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hold == nil {
		f.hold = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	f.hold[call] = ch
	return sync.OnceFunc(func() { close(ch) })
}

func (f *fakeOps) setFail(call string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		f.fail = map[string]error{}
	}
	f.fail[call] = err
}

func (f *fakeOps) history() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeOps) WaitForAttach(_ context.Context, name volume.Name, src volume.Source) error {
	err := f.record("attach " + string(name))
	f.world.RecordAttach(name, id(src), map[string]string{"devicePath": "/dev/x"}, err)
	return err
}

func (f *fakeOps) Stage(_ context.Context, name volume.Name, src volume.Source, _ *int64) error {
	if src.Inline {
		return nil
	}
	err := f.record("stage " + string(name))
	state := volume.Staged
	if err != nil {
		state = volume.NotStaged
	}
	f.world.RecordStage(name, id(src), asw.StageOutcome{Step: volume.StepStage, State: state, SELinuxContext: src.SELinuxContext, Err: err})
	return err
}

func (f *fakeOps) Publish(ctx context.Context, key volume.PodKey, src volume.Source, _ volume.PodVolume) error {
	err := f.recordHeld(ctx, "publish "+key.String())
	state := volume.Published
	if err != nil {
		state = volume.NotPublished
	}
	f.world.RecordPublish(key, id(src), asw.PublishOutcome{Step: volume.StepPublish, State: state, Err: err})
	return err
}

func (f *fakeOps) Unpublish(_ context.Context, key volume.PodKey) error {
	if err := f.record("unpublish " + key.String()); err != nil {
		return err
	}
	f.world.ForgetPod(key)
	return nil
}

func (f *fakeOps) Unstage(_ context.Context, name volume.Name) error {
	if err := f.world.MayUnstage(name); err != nil {
		return err
	}
	v, _ := f.world.Volume(name)
	if v.Stage != volume.NotStaged {
		if err := f.record("unstage " + string(name)); err != nil {
			return err
		}
	}
	f.world.ForgetVolume(name)
	return nil
}

type fakePolicies struct{ attachRequired bool }

func (f fakePolicies) Get(string) volume.Policy {
	p := volume.DefaultPolicy()
	p.AttachRequired = f.attachRequired
	return p
}

// policyByDriver gives attachRequired per driver; drivers not listed
// need no attach.
type policyByDriver map[string]bool

func (f policyByDriver) Get(driver string) volume.Policy {
	p := volume.DefaultPolicy()
	p.AttachRequired = f[driver]
	return p
}

type fakeDrivers struct {
	mu         sync.Mutex
	registered map[string]bool
}

func (f *fakeDrivers) Registered(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.registered[name]
}

func (f *fakeDrivers) set(name string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registered[name] = ok
}

type fakeStatus struct {
	mu   sync.Mutex
	last map[types.UID]status.PodVolumesStatus
}

func (f *fakeStatus) Set(s status.PodVolumesStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last[s.Pod.UID] = s
}

func (f *fakeStatus) Forget(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.last, uid)
}

func (f *fakeStatus) get(uid types.UID) (status.PodVolumesStatus, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.last[uid]
	return s, ok
}

type fakeEvents struct {
	mu      sync.Mutex
	reasons []string
}

func (f *fakeEvents) VolumeFailed(_ volume.PodInfo, b status.Blocker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reasons = append(f.reasons, b.Reason())
}

type fakeInUse struct {
	mu       sync.Mutex
	set      []volume.Name
	reported map[volume.Name]bool
}

func (f *fakeInUse) Set(names []volume.Name) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = slices.Clone(names)
}

func (f *fakeInUse) Reported(name volume.Name) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reported[name]
}

type readyCounter struct {
	mu sync.Mutex
	n  int
}

func (c *readyCounter) ObservePodReady(volume.PodInfo, time.Time, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
}

// harness is a reconciler over real dsw and asw stores with fake steps.
type harness struct {
	desired *dsw.Store
	actual  *asw.World
	ops     *fakeOps
	drivers *fakeDrivers
	status  *fakeStatus
	events  *fakeEvents
	ready   *readyCounter
	r       *Reconciler
	synced  chan struct{}

	// seen counts the keys the reconciler handled.
	seenMu sync.Mutex
	seen   map[any]int
}

func (h *harness) processed(key any, _ error) {
	h.seenMu.Lock()
	defer h.seenMu.Unlock()
	h.seen[key]++
}

func (h *harness) seenCount(key any) int {
	h.seenMu.Lock()
	defer h.seenMu.Unlock()
	return h.seen[key]
}

func newHarness(t *testing.T, mutate ...func(*Config)) *harness {
	t.Helper()
	h := &harness{
		desired: dsw.New(),
		actual:  asw.New(asw.Options{}),
		drivers: &fakeDrivers{registered: map[string]bool{testDriver: true}},
		status:  &fakeStatus{last: map[types.UID]status.PodVolumesStatus{}},
		events:  &fakeEvents{},
		ready:   &readyCounter{},
		synced:  make(chan struct{}),
		seen:    map[any]int{},
	}
	h.ops = &fakeOps{world: h.actual}
	cfg := Config{
		Desired: h.desired, Actual: h.actual, Operations: h.ops, Policies: fakePolicies{},
		Drivers: h.drivers, Synced: h.synced, Status: h.status, Events: h.events, Ready: h.ready,
		RetryBaseDelay: time.Millisecond, RetryMaxDelay: 10 * time.Millisecond,
		processed: h.processed,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.r = r
	h.desired.Subscribe(r.DesiredStateHandler())
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

func pvSource(handle string) volume.Source {
	return volume.Source{ID: volume.ID{Driver: testDriver, Handle: handle, PVName: "pv-" + handle, AccessType: volume.Filesystem}}
}

// setPod makes pod uid want the given sources.
func (h *harness) setPod(uid types.UID, srcs ...volume.Source) {
	p := dsw.Pod{Info: volume.PodInfo{UID: uid, Namespace: "ns", Name: "pod-" + string(uid)}, FirstSeen: time.Now()}
	for i, src := range srcs {
		name := volume.PersistentName(src.Driver, src.Handle)
		if src.Inline {
			name = volume.InlineName(uid, "inline")
		}
		p.Uses = append(p.Uses, dsw.Use{Name: name, Source: src, Volume: volume.PodVolume{SpecName: fmt.Sprintf("vol-%d", i)}})
	}
	h.desired.SetPod(p)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func (h *harness) waitCalls(t *testing.T, want ...string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return slices.Equal(h.ops.history(), want), nil })
	if err != nil {
		t.Fatalf("calls = %q, want %q", h.ops.history(), want)
	}
}
