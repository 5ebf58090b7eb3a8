package operations

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/utils/ptr"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/csiclient/csiclienttest"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestOwnershipNeeded(t *testing.T) {
	rwo := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	base := func() (volume.Source, volume.PodVolume, volume.Policy) {
		return volume.Source{ID: volume.ID{AccessType: volume.Filesystem}, FSType: "ext4", AccessModes: rwo},
			volume.PodVolume{FSGroup: ptr.To[int64](2000)}, volume.DefaultPolicy()
	}
	noCaps := csiclient.NewNodeCapabilities()
	for name, tc := range map[string]struct {
		change func(*volume.Source, *volume.PodVolume, *volume.Policy)
		caps   *csiclient.NodeCapabilities
		want   bool
	}{
		"RWO with fsType": {change: func(*volume.Source, *volume.PodVolume, *volume.Policy) {}, want: true},
		"RWOP": {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) {
			s.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
		}, want: true},
		"RWX and RWO": {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) {
			s.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany, corev1.ReadWriteOnce}
		}, want: true},
		"RWX only": {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) {
			s.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		}},
		"no access modes": {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) { s.AccessModes = nil }},
		"no fsType":       {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) { s.FSType = "" }},
		"no fsType, policy File": {change: func(s *volume.Source, _ *volume.PodVolume, p *volume.Policy) {
			s.FSType = ""
			p.FSGroupPolicy = storagev1.FileFSGroupPolicy
		}, want: true},
		"RWX, policy File": {change: func(s *volume.Source, _ *volume.PodVolume, p *volume.Policy) {
			s.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
			p.FSGroupPolicy = storagev1.FileFSGroupPolicy
		}, want: true},
		"policy None": {change: func(_ *volume.Source, _ *volume.PodVolume, p *volume.Policy) {
			p.FSGroupPolicy = storagev1.NoneFSGroupPolicy
		}},
		"no fsGroup":             {change: func(_ *volume.Source, pv *volume.PodVolume, _ *volume.Policy) { pv.FSGroup = nil }},
		"read-only":              {change: func(_ *volume.Source, pv *volume.PodVolume, _ *volume.Policy) { pv.ReadOnly = true }},
		"block":                  {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) { s.AccessType = volume.Block }},
		"inline with fsType":     {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) { s.Inline, s.AccessModes = true, nil }, want: true},
		"inline without fsType":  {change: func(s *volume.Source, _ *volume.PodVolume, _ *volume.Policy) { s.Inline, s.FSType = true, "" }},
		"driver has mount group": {change: func(*volume.Source, *volume.PodVolume, *volume.Policy) {}, caps: ptr.To(csiclient.NewNodeCapabilities(csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP))},
		"mount group, policy File": {change: func(_ *volume.Source, _ *volume.PodVolume, p *volume.Policy) {
			p.FSGroupPolicy = storagev1.FileFSGroupPolicy
		}, caps: ptr.To(csiclient.NewNodeCapabilities(csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP))},
	} {
		t.Run(name, func(t *testing.T) {
			src, pv, pol := base()
			tc.change(&src, &pv, &pol)
			caps := noCaps
			if tc.caps != nil {
				caps = *tc.caps
			}
			if got := ownershipNeeded(src, pv, pol, caps); got != tc.want {
				t.Errorf("ownershipNeeded = %v, want %v", got, tc.want)
			}
		})
	}
}

// mkdirDriver is the fake driver, except that NodePublishVolume makes the
// target a directory holding files files, as a driver's mount would show
// them, and calls during (if set) while it runs.
type mkdirDriver struct {
	*csiclienttest.Client
	files  int
	during func()
}

func (d *mkdirDriver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) error {
	dir := filepath.Join(req.GetTargetPath(), "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(req.GetTargetPath(), 0o755); err != nil {
		return err
	}
	for i := range d.files {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), nil, 0o644); err != nil {
			return err
		}
	}
	if d.during != nil {
		d.during()
	}
	return d.Client.NodePublishVolume(ctx, req)
}

// NodeUnpublishVolume empties the target, as a driver's unmount does.
func (d *mkdirDriver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) error {
	if err := os.RemoveAll(filepath.Join(req.GetTargetPath(), "data")); err != nil {
		return err
	}
	return d.Client.NodeUnpublishVolume(ctx, req)
}

// fakeOwnership records OwnershipObserver calls.
type fakeOwnership struct {
	mu      sync.Mutex
	files   int64
	running int
	done    []string
}

func (f *fakeOwnership) OwnershipFiles(_ string, n int64) { f.mu.Lock(); f.files += n; f.mu.Unlock() }
func (f *fakeOwnership) OwnershipRunning(_ string, d int) { f.mu.Lock(); f.running += d; f.mu.Unlock() }
func (f *fakeOwnership) OwnershipDone(_, r string) {
	f.mu.Lock()
	f.done = append(f.done, r)
	f.mu.Unlock()
}

func ownershipHarness(t *testing.T, files int, cfg func(*Config)) (*harness, *mkdirDriver, *fakeOwnership) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to change groups")
	}
	d := &mkdirDriver{Client: &csiclienttest.Client{Name: testDriver}, files: files}
	h := newHarness(t, harnessOptions{client: d})
	d.Client = h.client
	own := &fakeOwnership{}
	ops, err := New(func() Config {
		c := Config{RootDir: h.root, NodeName: testNode, Drivers: DriversFunc(h.driver), Policies: h.policies,
			Attachments: h.vas, State: h.world, Secrets: h.secrets, Mounts: h.mounts, Observer: h.obs, Ownership: own}
		if cfg != nil {
			cfg(&c)
		}
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	h.ops = ops
	h.noAttach()
	return h, d, own
}

func writablePodVolume(uid string) volume.PodVolume {
	pv := podVolume(uid, "pod-"+uid)
	pv.ReadOnly = false
	return pv
}

// TestPublishGivesFilesToFSGroup: without VOLUME_MOUNT_GROUP the agent
// gives the published volume's files to the pod's fsGroup, as the kubelet.
func TestPublishGivesFilesToFSGroup(t *testing.T) {
	h, _, own := ownershipHarness(t, 3, nil)
	src := pvSource()
	key := keyOf(src, "uid-a")
	ctx := testContext(t)
	if err := h.ops.Stage(ctx, key.Volume, src, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.Publish(ctx, key, src, writablePodVolume("uid-a")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	p, _ := h.world.Pod(key)
	for _, rel := range []string{"", "data", "data/0", "data/2"} {
		fi, err := os.Stat(filepath.Join(p.TargetPath, rel))
		if err != nil {
			t.Fatal(err)
		}
		if gid := statGID(fi); gid != 2000 || fi.Mode().Perm()&0o060 != 0o060 {
			t.Errorf("%s: group %d mode %v, want group 2000 with group rw", rel, gid, fi.Mode())
		}
	}
	own.mu.Lock()
	defer own.mu.Unlock()
	if own.files != 5 || own.running != 0 || len(own.done) != 1 || own.done[0] != OwnershipChanged {
		t.Errorf("observed files %d, running %d, done %v; want 5, 0, [changed]", own.files, own.running, own.done)
	}
	var walked bool
	for _, o := range h.obs.list() {
		walked = walked || (o.step == volume.StepApplyAccessControl && o.err == nil)
	}
	if !walked {
		t.Errorf("no %s observed: %v", volume.StepApplyAccessControl, h.obs.list())
	}
	if p.State != volume.Published || p.Progress != nil {
		t.Errorf("pod entry = %+v, want Published without progress", p)
	}
}

// TestOwnershipProgressAndInterrupt: a long change records its progress
// (the pod's condition shows it) and stops when the pod no longer wants
// the volume; the publish is then uncertain, so it is torn down.
func TestOwnershipProgressAndInterrupt(t *testing.T) {
	var (
		mu       sync.Mutex
		progress []asw.Progress
		h        *harness
		key      volume.PodKey
		stop     = make(chan struct{})
		stopOnce sync.Once
	)
	h, d, own := ownershipHarness(t, 20000, func(c *Config) {
		c.ProgressInterval = time.Millisecond
		c.OnProgress = func(k volume.PodKey) {
			p, _ := h.world.Pod(k)
			if p.Progress == nil {
				return
			}
			mu.Lock()
			progress = append(progress, *p.Progress)
			n := len(progress)
			mu.Unlock()
			if n == 3 {
				stopOnce.Do(func() { close(stop) })
			}
		}
	})
	src := pvSource()
	key = keyOf(src, "uid-a")
	ctx := testContext(t)
	if err := h.ops.Stage(ctx, key.Volume, src, nil); err != nil {
		t.Fatal(err)
	}
	go func() { <-stop; h.ops.Interrupt(key) }()
	err := h.ops.Publish(ctx, key, src, writablePodVolume("uid-a"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish = %v, want the ownership change interrupted", err)
	}
	p, _ := h.world.Pod(key)
	if p.State != volume.PublishUncertain || p.LastError == nil || p.LastError.Step != volume.StepApplyAccessControl || p.Progress != nil {
		t.Errorf("pod entry = %+v, want PublishUncertain with the %s error and no progress", p, volume.StepApplyAccessControl)
	}
	mu.Lock()
	if len(progress) < 3 || progress[0].FSGroup != 2000 || progress[0].Step != volume.StepApplyAccessControl {
		t.Errorf("progress = %+v, want at least 3 reports for fsGroup 2000", progress)
	}
	for i := 1; i < len(progress); i++ {
		if progress[i].Files < progress[i-1].Files {
			t.Errorf("progress went back: %+v", progress)
		}
	}
	mu.Unlock()
	if fi, err := os.Stat(p.TargetPath); err != nil || statGID(fi) == 2000 {
		t.Errorf("the root of an interrupted change has the group (%v): OnRootMismatch would skip the rest", err)
	}
	own.mu.Lock()
	if len(own.done) != 1 || own.done[0] != OwnershipInterrupted || own.running != 0 {
		t.Errorf("observed done %v running %d, want [interrupted] 0", own.done, own.running)
	}
	own.mu.Unlock()

	// Interrupted before the walk started (the pod went during the call).
	d.files = 1
	key2 := keyOf(src, "uid-b")
	d.during = func() { h.ops.Interrupt(key2) }
	if err := h.ops.Publish(ctx, key2, src, writablePodVolume("uid-b")); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish interrupted during NodePublishVolume = %v, want context.Canceled", err)
	}
	if err := h.ops.Unpublish(ctx, key); err != nil {
		t.Errorf("Unpublish after the interrupted change: %v", err)
	}
}
