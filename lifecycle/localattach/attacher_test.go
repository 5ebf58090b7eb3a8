package localattach

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const (
	driverName = "attach.csi.example.com"
	nodeID     = "node-id-7"
	nodeName   = "node-a"
)

var src = volume.Source{
	ID:          volume.ID{Driver: driverName, Handle: "vol-1", PVName: "pv-1", AccessType: volume.Filesystem},
	AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, FSType: "xfs",
	MountOptions: []string{"noatime"}, Attributes: map[string]string{"k": "v"},
}

var volName = volume.PersistentName(src.Driver, src.Handle)

// env is an Attacher over a real in-process CSI driver.
type env struct {
	t       *testing.T
	ctx     context.Context
	root    string
	driver  *csiclienttest.Driver
	drivers fakeDrivers
	inUse   *inUseSet
	// unwanted are the volumes no pod wants (all others are wanted).
	unwanted *inUseSet
	synced   chan struct{}
	policy   volume.Policy
	logs     ktesting.Underlier
}

// fakeDrivers are the registered drivers: a connection and a node ID each.
type fakeDrivers map[string]registered

type registered struct {
	client *csiclient.Client
	nodeID string
}

func (f fakeDrivers) Client(name string) (*csiclient.Client, bool) {
	d, ok := f[name]
	return d.client, ok
}

func (f fakeDrivers) NodeID(name string) (string, bool) {
	d, ok := f[name]
	return d.nodeID, ok
}

type fixedPolicy struct{ p volume.Policy }

func (f fixedPolicy) Get(string) volume.Policy { return f.p }

type inUseSet struct {
	mu    sync.Mutex
	names map[volume.Name]bool
}

func (s *inUseSet) set(n volume.Name, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[n] = on
}

func (s *inUseSet) has(n volume.Name) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[n]
}

type pvs map[string]*corev1.PersistentVolume

func (p pvs) PV(name string) (*corev1.PersistentVolume, error) {
	if pv, ok := p[name]; ok {
		return pv, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumes"), name)
}

type secrets map[string]map[string]string

func (s secrets) GetSecret(_ context.Context, ns, name string) (map[string]string, error) {
	if d, ok := s[ns+"/"+name]; ok {
		return d, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
}

func newEnv(t *testing.T) *env {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(5)))
	ctx := klog.NewContext(t.Context(), logger)
	e := &env{
		logs: logger.GetSink().(ktesting.Underlier),
		t:    t, ctx: ctx, root: t.TempDir(),
		driver:   csiclienttest.NewDriver(driverName, nodeID),
		inUse:    &inUseSet{names: map[volume.Name]bool{}},
		unwanted: &inUseSet{names: map[volume.Name]bool{}},
		synced:   make(chan struct{}),
		policy:   volume.DefaultPolicy(),
	}
	endpoint := csiclienttest.StartServer(t, e.driver.Servers())
	client, err := csiclient.New(ctx, csiclient.Config{DriverName: driverName, Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	e.drivers = fakeDrivers{driverName: {client: client, nodeID: nodeID}}
	return e
}

// attacher returns a new Attacher over e (as after a restart, when called
// twice); run starts its Run until the test ends.
func (e *env) attacher(run bool) *Attacher {
	e.t.Helper()
	pv := &corev1.PersistentVolume{Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
		CSI: &corev1.CSIPersistentVolumeSource{
			Driver: driverName, VolumeHandle: "vol-1", ReadOnly: true,
			ControllerPublishSecretRef: &corev1.SecretReference{Namespace: "ns", Name: "creds"},
		},
	}}}
	a, err := New(Config{
		RootDir: e.root, NodeName: nodeName, Drivers: e.drivers, Policies: fixedPolicy{e.policy},
		Volumes: pvs{"pv-1": pv}, Secrets: secrets{"ns/creds": {"password": "s3cret"}},
		InUse: e.inUse.has, Synced: e.synced,
		Wanted:         func(n volume.Name) bool { return !e.unwanted.has(n) },
		RetryBaseDelay: 10 * time.Millisecond, RetryMaxDelay: 100 * time.Millisecond,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if run {
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan struct{})
		go func() { a.Run(ctx); close(done) }()
		e.t.Cleanup(func() { cancel(); <-done })
	}
	return a
}

func (e *env) recordFiles() []string {
	e.t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.root, recordsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	var out []string
	for _, ent := range entries {
		out = append(out, ent.Name())
	}
	return out
}

func (e *env) until(what string, cond func() bool) {
	e.t.Helper()
	if err := wait.PollUntilContextTimeout(e.t.Context(), 5*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		e.t.Fatalf("waiting for %s: %v", what, err)
	}
}

func vaName() string { return volume.AttachmentName(src.Handle, src.Driver, nodeName) }

func TestAttachCallsControllerPublishAndGetReportsThePublishContext(t *testing.T) {
	e := newEnv(t)
	e.driver.SetHandler(csi.Controller_ControllerPublishVolume_FullMethodName, func(context.Context, proto.Message) (proto.Message, error) {
		return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"devicePath": "/dev/x"}}, nil
	})
	a := e.attacher(false)
	if _, err := a.Get(vaName()); !apierrors.IsNotFound(err) {
		t.Fatalf("Get before attach: %v, want NotFound", err)
	}
	if err := a.Attach(e.ctx, volName, src); err != nil {
		t.Fatal(err)
	}

	reqs := e.driver.Requests(csi.Controller_ControllerPublishVolume_FullMethodName)
	if len(reqs) != 1 {
		t.Fatalf("%d ControllerPublishVolume calls, want 1", len(reqs))
	}
	req := reqs[0].(*csi.ControllerPublishVolumeRequest)
	want := &csi.ControllerPublishVolumeRequest{
		VolumeId: "vol-1", NodeId: nodeID, Readonly: true,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs", MountFlags: []string{"noatime"}}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		Secrets:       map[string]string{"password": "s3cret"},
		VolumeContext: map[string]string{"k": "v"},
	}
	if !proto.Equal(req, want) {
		t.Errorf("ControllerPublishVolume request\n got %v\nwant %v", req, want)
	}
	va, err := a.Get(vaName())
	if err != nil {
		t.Fatal(err)
	}
	if !va.Status.Attached || va.Status.AttachmentMetadata["devicePath"] != "/dev/x" || va.Status.AttachError != nil {
		t.Errorf("VolumeAttachment status %+v, want attached with devicePath /dev/x", va.Status)
	}
	if files := e.recordFiles(); !slices.Equal(files, []string{vaName() + ".json"}) {
		t.Errorf("records %v, want one for %s", files, vaName())
	}
	data, err := os.ReadFile(filepath.Join(e.root, recordsDir, vaName()+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "s3cret") || !strings.Contains(string(data), `"nodeID":"`+nodeID+`"`) {
		t.Errorf("record %s holds secret data or nothing", data)
	}
}

func TestDriverWithoutControllerPublishIsAttachedWithoutACall(t *testing.T) {
	e := newEnv(t)
	e.driver.SetHandler(csi.Controller_ControllerGetCapabilities_FullMethodName, func(context.Context, proto.Message) (proto.Message, error) {
		return &csi.ControllerGetCapabilitiesResponse{}, nil
	})
	a := e.attacher(true)
	if err := a.Attach(e.ctx, volName, src); err != nil {
		t.Fatal(err)
	}
	va, err := a.Get(vaName())
	if err != nil || !va.Status.Attached || va.Status.AttachmentMetadata != nil {
		t.Fatalf("Get: %+v, %v; want attached with no publish_context", va, err)
	}
	close(e.synced)
	a.Release(volName)
	e.until("the attachment to be forgotten", func() bool {
		_, err := a.Get(vaName())
		return apierrors.IsNotFound(err)
	})
	if n := e.driver.CallCount(csi.Controller_ControllerPublishVolume_FullMethodName) + e.driver.CallCount(csi.Controller_ControllerUnpublishVolume_FullMethodName); n != 0 {
		t.Errorf("%d controller publish/unpublish calls, want none", n)
	}
	if files := e.recordFiles(); len(files) != 0 {
		t.Errorf("records %v, want none", files)
	}
}

func TestNoAttachWhenThePolicySaysSo(t *testing.T) {
	e := newEnv(t)
	e.policy.AttachRequired = false
	a := e.attacher(false)
	if err := a.Attach(e.ctx, volName, src); err != nil {
		t.Fatal(err)
	}
	if n := e.driver.CallCount(csi.Controller_ControllerGetCapabilities_FullMethodName); n != 0 {
		t.Errorf("%d ControllerGetCapabilities calls for a driver with attachRequired=false", n)
	}
	if _, err := a.Get(vaName()); !apierrors.IsNotFound(err) {
		t.Errorf("Get: %v, want NotFound", err)
	}
}

func TestReleaseDetachesOnlyWhatIsNotInUse(t *testing.T) {
	e := newEnv(t)
	a := e.attacher(true)
	close(e.synced)
	if err := a.Attach(e.ctx, volName, src); err != nil {
		t.Fatal(err)
	}

	// Wanted again by the time the detach runs: it stays attached.
	e.inUse.set(volName, true)
	a.Release(volName)
	e.until("the release to be handled", func() bool {
		return strings.Contains(e.logs.GetBuffer().String(), "Not detaching a volume in use")
	})
	if va, err := a.Get(vaName()); err != nil || !va.Status.Attached {
		t.Fatalf("volume in use: Get %+v, %v; want still attached", va, err)
	}
	if n := e.driver.CallCount(csi.Controller_ControllerUnpublishVolume_FullMethodName); n != 0 {
		t.Fatalf("ControllerUnpublishVolume called %d times for a volume in use", n)
	}

	e.inUse.set(volName, false)
	a.Release(volName)
	e.until("ControllerUnpublishVolume", func() bool {
		_, err := a.Get(vaName())
		return apierrors.IsNotFound(err)
	})
	reqs := e.driver.Requests(csi.Controller_ControllerUnpublishVolume_FullMethodName)
	want := &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: nodeID, Secrets: map[string]string{"password": "s3cret"}}
	if len(reqs) != 1 || !proto.Equal(reqs[0], want) {
		t.Errorf("ControllerUnpublishVolume requests %v, want one %v", reqs, want)
	}
	if files := e.recordFiles(); len(files) != 0 {
		t.Errorf("records %v after detach, want none", files)
	}
}

func TestFailedPublishIsReportedAndStillDetached(t *testing.T) {
	e := newEnv(t)
	e.driver.SetError(csi.Controller_ControllerPublishVolume_FullMethodName, status.Error(codes.DeadlineExceeded, "slow backend"))
	a := e.attacher(true)
	close(e.synced)
	if err := a.Attach(e.ctx, volName, src); !errors.Is(err, csiclient.ErrUncertain) {
		t.Fatalf("Attach: %v, want an uncertain CSI error", err)
	}
	va, err := a.Get(vaName())
	if err != nil || va.Status.Attached || va.Status.AttachError == nil {
		t.Fatalf("Get: %+v, %v; want not attached with an attach error", va, err)
	}
	// The call may have attached the volume: releasing it detaches.
	a.Release(volName)
	e.until("ControllerUnpublishVolume", func() bool {
		return e.driver.CallCount(csi.Controller_ControllerUnpublishVolume_FullMethodName) == 1 && len(e.recordFiles()) == 0
	})
}

func TestAttachmentsOfAnEarlierRunAreDetachedAfterSyncWhenUnused(t *testing.T) {
	e := newEnv(t)
	first := e.attacher(false)
	other := src
	other.Handle, other.PVName = "vol-2", "pv-2"
	otherName := volume.PersistentName(other.Driver, other.Handle)
	for n, s := range map[volume.Name]volume.Source{volName: src, otherName: other} {
		if err := first.Attach(e.ctx, n, s); err != nil {
			t.Fatal(err)
		}
	}

	// A restart: the new Attacher knows both from their records; only vol-1
	// is still in use.
	e.inUse.set(volName, true)
	second := e.attacher(true)
	if n := e.driver.CallCount(csi.Controller_ControllerUnpublishVolume_FullMethodName); n != 0 {
		t.Fatalf("ControllerUnpublishVolume called %d times before the desired state synced", n)
	}
	close(e.synced)
	e.until("the unused attachment to be detached", func() bool {
		return e.driver.CallCount(csi.Controller_ControllerUnpublishVolume_FullMethodName) == 1 && len(e.recordFiles()) == 1
	})
	req := e.driver.Requests(csi.Controller_ControllerUnpublishVolume_FullMethodName)[0].(*csi.ControllerUnpublishVolumeRequest)
	if req.GetVolumeId() != "vol-2" {
		t.Errorf("detached %s, want vol-2", req.GetVolumeId())
	}
	// vol-1's publish_context is not known after the restart until it is
	// attached again (ControllerPublishVolume is idempotent).
	if va, err := second.Get(vaName()); err != nil || va.Status.Attached {
		t.Errorf("Get of a recorded attachment after restart: %+v, %v; want known, not attached", va, err)
	}
}

// steps is a fake inner Steps that records the calls.
type fakeSteps struct {
	mu         sync.Mutex
	calls      []string
	unstageErr error
	a          *Attacher
	attached   bool
}

func (f *fakeSteps) note(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
}

func (f *fakeSteps) WaitForAttach(_ context.Context, _ volume.Name, s volume.Source) error {
	va, err := f.a.Get(volume.AttachmentName(s.Handle, s.Driver, nodeName))
	f.attached = err == nil && va.Status.Attached
	f.note("WaitForAttach")
	return nil
}
func (f *fakeSteps) Stage(context.Context, volume.Name, volume.Source, *int64) error {
	f.note("Stage")
	return nil
}
func (f *fakeSteps) Publish(context.Context, volume.PodKey, volume.Source, volume.PodVolume) error {
	f.note("Publish")
	return nil
}
func (f *fakeSteps) Unpublish(context.Context, volume.PodKey) error { f.note("Unpublish"); return nil }
func (f *fakeSteps) Unstage(context.Context, volume.Name) error {
	f.note("Unstage")
	return f.unstageErr
}

func TestWrapAttachesBeforeWaitForAttachAndReleasesAfterUnstage(t *testing.T) {
	e := newEnv(t)
	a := e.attacher(true)
	close(e.synced)
	inner := &fakeSteps{a: a, unstageErr: errors.New("busy")}
	steps := a.Wrap(inner)
	if err := steps.WaitForAttach(e.ctx, volName, src); err != nil {
		t.Fatal(err)
	}
	if !inner.attached {
		t.Fatal("the wrapped WaitForAttach did not see the volume attached")
	}
	if err := steps.Unstage(e.ctx, volName); err == nil {
		t.Fatal("Unstage hid the wrapped step's error")
	}
	// A failed unstage keeps the attachment: the volume may still be staged.
	if va, err := a.Get(vaName()); err != nil || !va.Status.Attached {
		t.Fatalf("after a failed unstage: %+v, %v; want attached", va, err)
	}
	inner.unstageErr = nil
	if err := steps.Unstage(e.ctx, volName); err != nil {
		t.Fatal(err)
	}
	e.until("the detach after unstage", func() bool {
		return e.driver.CallCount(csi.Controller_ControllerUnpublishVolume_FullMethodName) == 1
	})
}

func TestAttachThatNeverReachedTheDriverIsNotKept(t *testing.T) {
	e := newEnv(t)
	delete(e.drivers, driverName)
	a := e.attacher(false)
	inner := &fakeSteps{a: a}
	if err := a.Attach(e.ctx, volName, src); !errors.Is(err, volume.ErrDriverNotRegistered) {
		t.Fatalf("Attach without the driver: %v, want ErrDriverNotRegistered", err)
	}
	// Get reports the failure to the wrapped step...
	va, err := a.Get(vaName())
	if err != nil || va.Status.AttachError == nil || !strings.Contains(va.Status.AttachError.Message, "not registered") {
		t.Fatalf("Get: %+v, %v; want the attach error", va, err)
	}
	// ...and once it has recorded it, nothing is kept for a volume that
	// was never attached.
	if err := a.Wrap(inner).WaitForAttach(e.ctx, volName, src); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(vaName()); !apierrors.IsNotFound(err) {
		t.Errorf("Get after the wrapped WaitForAttach: %v, want NotFound", err)
	}
}

// TestNoAttachForAVolumeNoPodWants: the reconciler decided to attach while a
// pod wanted the volume, but the pod is gone by the time of the call (the
// volume's teardown is under way): no ControllerPublishVolume is sent and
// no record is left; a record of an earlier attach stays, its detach due.
func TestNoAttachForAVolumeNoPodWants(t *testing.T) {
	e := newEnv(t)
	a := e.attacher(false)
	e.unwanted.set(volName, true)
	if err := a.Attach(e.ctx, volName, src); !errors.Is(err, volume.ErrNotAttached) {
		t.Fatalf("Attach of a volume no pod wants: %v, want ErrNotAttached", err)
	}
	if n := e.driver.CallCount(csi.Controller_ControllerPublishVolume_FullMethodName); n != 0 {
		t.Errorf("%d ControllerPublishVolume calls for a volume no pod wants, want 0", n)
	}
	if files := e.recordFiles(); len(files) != 0 {
		t.Errorf("records %v left by an attach that did not start", files)
	}

	// Attached while wanted, then a restart: the record of that attach
	// survives an attach refused for a volume no pod wants any more.
	e.unwanted.set(volName, false)
	if err := a.Attach(e.ctx, volName, src); err != nil {
		t.Fatal(err)
	}
	restarted := e.attacher(false)
	e.unwanted.set(volName, true)
	if err := restarted.Attach(e.ctx, volName, src); !errors.Is(err, volume.ErrNotAttached) {
		t.Fatalf("Attach after the restart: %v, want ErrNotAttached", err)
	}
	if n := e.driver.CallCount(csi.Controller_ControllerPublishVolume_FullMethodName); n != 1 {
		t.Errorf("%d ControllerPublishVolume calls, want the 1 made while wanted", n)
	}
	if files := e.recordFiles(); !slices.Equal(files, []string{vaName() + ".json"}) {
		t.Errorf("records %v, want the earlier attach's record kept for its detach", files)
	}
}
