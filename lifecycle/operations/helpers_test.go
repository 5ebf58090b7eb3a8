package operations

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const (
	testDriver = "fake.csi.example.com"
	testNode   = "node-1"
)

var _ DriverClient = &csiclienttest.Client{}

// fakePolicies answers volume.DefaultPolicy() unless a driver has its own.
type fakePolicies struct {
	mu sync.Mutex
	m  map[string]volume.Policy
}

func (f *fakePolicies) Get(name string) volume.Policy {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.m[name]; ok {
		return p
	}
	return volume.DefaultPolicy()
}

func (f *fakePolicies) set(name string, p volume.Policy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[name] = p
}

// fakeAttachments is a VolumeAttachment cache.
type fakeAttachments struct {
	mu sync.Mutex
	m  map[string]*storagev1.VolumeAttachment
}

func (f *fakeAttachments) Get(name string) (*storagev1.VolumeAttachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if va, ok := f.m[name]; ok {
		return va, nil
	}
	return nil, apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
}

func (f *fakeAttachments) set(va *storagev1.VolumeAttachment) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[va.Name] = va
}

// attached returns an attached VolumeAttachment for src on testNode.
func attached(src volume.Source, metadata map[string]string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: volume.AttachmentName(src.Handle, src.Driver, testNode)},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: src.Driver, NodeName: testNode},
		Status:     storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: metadata},
	}
}

// fakeSecrets holds Secrets by namespace/name and counts reads.
type fakeSecrets struct {
	mu    sync.Mutex
	m     map[string]map[string]string
	reads []string
}

func (f *fakeSecrets) GetSecret(_ context.Context, namespace, name string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads = append(f.reads, namespace+"/"+name)
	s, ok := f.m[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
	}
	return s, nil
}

// fakeTokens issues "token-for-<audience>" tokens.
type fakeTokens struct{}

func (fakeTokens) ServiceAccountToken(_ context.Context, pod volume.PodInfo, req storagev1.TokenRequest) (authenticationv1.TokenRequestStatus, error) {
	return authenticationv1.TokenRequestStatus{
		Token:               "token-for-" + req.Audience + "-" + pod.ServiceAccount,
		ExpirationTimestamp: metav1.NewTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)),
	}, nil
}

// observation is one ObserveOperation call.
type observation struct {
	driver string
	step   volume.Step
	access volume.AccessType
	// migrated is left out: the steps of these tests are never of a
	// translated in-tree volume (lifecycle/metrics and test/e2e
	// TestInTreeEBSVolume check the label).
	err error
}

type fakeObserver struct {
	mu  sync.Mutex
	obs []observation
}

func (f *fakeObserver) ObserveOperation(driver string, step volume.Step, access volume.AccessType, _ bool, err error, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d < 0 {
		panic("negative duration")
	}
	f.obs = append(f.obs, observation{driver, step, access, err})
}

func (f *fakeObserver) list() []observation {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]observation(nil), f.obs...)
}

// stillMounted is the real mounter, except that the paths in mounted are
// reported as mount points.
type stillMounted struct {
	mount.Interface
	mu      sync.Mutex
	mounted map[string]bool
}

func (s *stillMounted) IsMountPoint(p string) (bool, error) {
	s.mu.Lock()
	m := s.mounted[p]
	s.mu.Unlock()
	if m {
		return true, nil
	}
	return s.Interface.IsMountPoint(p)
}

// harness is Operations over a fake driver client, with every dependency
// reachable for scripting.
type harness struct {
	root     string
	ops      *Operations
	world    *asw.World
	client   *csiclienttest.Client
	policies *fakePolicies
	vas      *fakeAttachments
	secrets  *fakeSecrets
	obs      *fakeObserver
	mounts   *stillMounted

	mu      sync.Mutex
	drivers map[string]DriverClient
}

// harnessOptions changes newHarness' defaults.
type harnessOptions struct {
	client DriverClient
	tokens Tokens
	root   string
}

func newHarness(t *testing.T, opts harnessOptions) *harness {
	t.Helper()
	h := &harness{
		root:     opts.root,
		world:    asw.New(asw.Options{}),
		client:   &csiclienttest.Client{Name: testDriver},
		policies: &fakePolicies{m: map[string]volume.Policy{}},
		vas:      &fakeAttachments{m: map[string]*storagev1.VolumeAttachment{}},
		secrets: &fakeSecrets{m: map[string]map[string]string{
			"ns/stage-secret":   {"stage-key": "stage-s3cr3t"},
			"ns/publish-secret": {"publish-key": "publish-s3cr3t"},
		}},
		obs:    &fakeObserver{},
		mounts: &stillMounted{Interface: mount.New(""), mounted: map[string]bool{}},
	}
	if h.root == "" {
		h.root = t.TempDir()
	}
	h.client.NextNodeCapabilities = csiclient.NewNodeCapabilities(csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME)
	var c DriverClient = h.client
	if opts.client != nil {
		c = opts.client
	}
	h.drivers = map[string]DriverClient{testDriver: c}
	ops, err := New(Config{
		RootDir:     h.root,
		NodeName:    testNode,
		Drivers:     DriversFunc(h.driver),
		Policies:    h.policies,
		Attachments: h.vas,
		State:       h.world,
		Secrets:     h.secrets,
		Tokens:      opts.tokens,
		Mounts:      h.mounts,
		Observer:    h.obs,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.ops = ops
	return h
}

func (h *harness) driver(name string) (DriverClient, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.drivers[name]
	return c, ok
}

func (h *harness) unregister(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.drivers, name)
}

// noAttach makes the test driver need no VolumeAttachment.
func (h *harness) noAttach() {
	p := volume.DefaultPolicy()
	p.AttachRequired = false
	h.policies.set(testDriver, p)
}

// setCaps scripts the fake client's node capabilities.
func (h *harness) setCaps(caps ...csi.NodeServiceCapability_RPC_Type) {
	h.client.Mu.Lock()
	defer h.client.Mu.Unlock()
	h.client.NextNodeCapabilities = csiclient.NewNodeCapabilities(caps...)
}

// requests returns the requests of method the fake client received.
func requests[T any](h *harness, method string) []T {
	h.client.Mu.Lock()
	defer h.client.Mu.Unlock()
	var out []T
	for _, c := range h.client.Calls {
		if c.Method == method {
			out = append(out, c.Request.(T))
		}
	}
	return out
}

// pvSource is a filesystem PV volume of the test driver with everything set.
func pvSource() volume.Source {
	return volume.Source{
		ID:            volume.ID{Driver: testDriver, Handle: "vol-1", PVName: "pv-1", AccessType: volume.Filesystem},
		AccessModes:   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany},
		FSType:        "ext4",
		MountOptions:  []string{"noatime", "nodiratime"},
		Attributes:    map[string]string{"attr": "value"},
		StageSecret:   &volume.SecretRef{Namespace: "ns", Name: "stage-secret"},
		PublishSecret: &volume.SecretRef{Namespace: "ns", Name: "publish-secret"},
	}
}

func podVolume(uid, name string) volume.PodVolume {
	gid := int64(2000)
	return volume.PodVolume{
		Pod:      volume.PodInfo{UID: types.UID(uid), Namespace: "ns", Name: name, ServiceAccount: "sa-" + name},
		SpecName: "data",
		ReadOnly: true,
		FSGroup:  &gid,
	}
}

func keyOf(src volume.Source, uid string) volume.PodKey {
	return volume.PodKey{Volume: volume.PersistentName(src.Driver, src.Handle), Pod: types.UID(uid)}
}

// exists reports whether path exists.
func exists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat %s: %v", path, err)
	}
	return err == nil
}

// treeOf lists every path below root, for "nothing left behind" checks.
func treeOf(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			out = append(out, strings.TrimPrefix(p, root))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return out
}

// testContext returns a context with a test logger and a deadline.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(5))))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds or the test times out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// published says whether pod's use of the volume is ready: Published, not
// uncertain.
func published(w *asw.World, key volume.PodKey) bool {
	p, ok := w.Pod(key)
	return ok && p.State == volume.Published
}
