package reconstruct

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const driver = "test.csi.example.com"

// fixture lays out records the way operations writes them and bind-mounts
// what the test says is intact, on the real mount table.
type fixture struct {
	t       *testing.T
	layout  paths.Layout
	mounter mount.Interface
}

func newFixture(t *testing.T) *fixture {
	root := t.TempDir()
	layout, err := paths.New(root)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, layout: layout, mounter: mount.New("")}
}

func (f *fixture) bindMount(target string) {
	f.t.Helper()
	src := f.t.TempDir()
	if err := os.MkdirAll(target, 0o750); err != nil {
		f.t.Fatal(err)
	}
	if err := f.mounter.Mount(src, target, "", []string{"bind"}); err != nil {
		f.t.Fatalf("bind mount %s: %v", target, err)
	}
	f.t.Cleanup(func() { _ = f.mounter.Unmount(target) })
}

func (f *fixture) staged(handle string, mounted bool) volume.Name {
	f.t.Helper()
	src := volume.Source{ID: volume.ID{Driver: driver, Handle: handle, PVName: "pv-" + handle, AccessType: volume.Filesystem}}
	st, err := f.layout.Staging(src.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := checkpoint.MkdirAll(st.Dir); err != nil {
		f.t.Fatal(err)
	}
	name := volume.PersistentName(driver, handle)
	if err := checkpoint.WriteStage(st.Record, checkpoint.StageRecord{
		VolumeHandle: handle, DriverName: driver, VolumeName: name, PVName: src.PVName,
		AccessType: volume.Filesystem, StagingPath: st.Path,
	}); err != nil {
		f.t.Fatal(err)
	}
	if mounted {
		f.bindMount(st.Path)
	}
	return name
}

func (f *fixture) published(handle, pod string, mounted bool) volume.PodKey {
	f.t.Helper()
	pub, err := f.layout.Publishing(types.UID("uid-"+pod), "pv-"+handle, volume.Filesystem)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := checkpoint.MkdirAll(pub.Dir); err != nil {
		f.t.Fatal(err)
	}
	name := volume.PersistentName(driver, handle)
	if err := checkpoint.WritePublish(pub.Record, checkpoint.PublishRecord{
		SpecVolID: "pv-" + handle, VolumeHandle: handle, DriverName: driver, NodeName: "node",
		VolumeLifecycleMode: storagev1.VolumeLifecyclePersistent, VolumeName: name, PodUID: types.UID("uid-" + pod),
		AccessType: volume.Filesystem, TargetPath: pub.Target,
	}); err != nil {
		f.t.Fatal(err)
	}
	if mounted {
		f.bindMount(pub.Target)
	}
	return volume.PodKey{Volume: name, Pod: types.UID("uid-" + pod)}
}

func TestReconstruction(t *testing.T) {
	f := newFixture(t)
	intactStage := f.staged("intact", true)
	lostStage := f.staged("lost", false)
	onlyStaged := f.staged("unpublished", true) // unpublished, not unstaged, when the agent died
	intactPub := f.published("intact", "a", true)
	lostPub := f.published("lost", "b", false)
	// A pod volume directory without a record is left alone.
	orphan, err := f.layout.Publishing("uid-orphan", "pv-x", volume.Filesystem)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(orphan.Dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(orphan.Record, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}

	_, ctx := ktesting.NewTestContext(t)
	world := asw.New(asw.Options{})
	res, err := Run(ctx, f.layout, f.mounter, world)
	if err != nil {
		t.Fatal(err)
	}
	if res.Staged != 3 || res.ProvenStaged != 2 || res.Published != 2 || res.ProvenPublished != 1 || len(res.Failed) != 1 {
		t.Errorf("result = %+v, want 3 staged (2 intact), 2 published (1 intact), 1 failed", res)
	}
	for name, want := range map[volume.Name]volume.StageState{intactStage: volume.Staged, lostStage: volume.StageUncertain, onlyStaged: volume.Staged} {
		v, ok := world.Volume(name)
		if !ok || v.Stage != want {
			t.Errorf("volume %s: stage %v (known %v), want %v", name, v.Stage, ok, want)
		}
	}
	for key, want := range map[volume.PodKey]volume.PublishState{intactPub: volume.Published, lostPub: volume.PublishUncertain} {
		p, ok := world.Pod(key)
		if !ok || p.State != want {
			t.Errorf("pod %s: publish %v (known %v), want %v", key, p.State, ok, want)
		}
	}
	// Every reconstructed publish must be torn down if unwanted.
	if pubs := world.Publishers(lostPub.Volume); len(pubs) != 1 {
		t.Errorf("uncertain publish not among the publishers: %v", pubs)
	}
	if len(res.Failed) > 0 && !errors.Is(res.Failed[0], checkpoint.ErrCorrupt) {
		t.Errorf("failure %v does not say the record is corrupt", res.Failed[0])
	}
}

// TestLeftoversOfInterruptedStepsAreRemoved is a chaos run's finding (seed
// 16016): an agent killed between removing a record and removing its
// directory (or after a publish failed on a full disk) left pod volume
// directories without a record, which every later start logged as
// "Cannot reconstruct pod volume; leaving it alone" and nobody removed. A
// directory with no record and nothing but the record's temporary files is
// removed at start, with the parents that became empty; one with anything
// else in it, or whose target is mounted, is left alone.
func TestLeftoversOfInterruptedStepsAreRemoved(t *testing.T) {
	f := newFixture(t)
	mkdir := func(dir string, files ...string) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	pub := func(pod, name string, access volume.AccessType) paths.Publishing {
		p, err := f.layout.Publishing(types.UID(pod), name, access)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := []string{
		mkdir(pub("uid-empty", "pv-a", volume.Filesystem).Dir),
		mkdir(pub("uid-tmp", "pv-b", volume.Filesystem).Dir, ".vol_data.json.tmp-123"),
		mkdir(pub("uid-block", "pv-c", volume.Block).Dir),
		mkdir(filepath.Join(f.layout.PluginDir(), driver, paths.HandleHash("h-empty"))),
	}
	kept := []string{
		mkdir(pub("uid-data", "pv-d", volume.Filesystem).Dir, "somebody's file"),
	}
	mounted := pub("uid-mounted", "pv-e", volume.Filesystem)
	f.bindMount(mounted.Target)
	kept = append(kept, mounted.Dir)

	_, ctx := ktesting.NewTestContext(t)
	res, err := Run(ctx, f.layout, f.mounter, asw.New(asw.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range gone {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it removed", dir, err)
		}
	}
	for _, dir := range []string{filepath.Join(f.layout.PodsDir(), "uid-empty"), filepath.Join(f.layout.PluginDir(), driver)} {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the parent %s that became empty: %v, want it removed", dir, err)
		}
	}
	for _, dir := range kept {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("%s: %v, want it left alone", dir, err)
		}
	}
	if res.Removed != len(gone) || len(res.Failed) != len(kept) {
		t.Errorf("Removed %d, Failed %v; want %d removed and %d failed", res.Removed, res.Failed, len(gone), len(kept))
	}
}

// TestEmptyPodDirectoriesAreRemoved is a chaos run's finding (seed 17016,
// make chaos' last check: "pods/<uid> is left in the root"): an agent
// killed while it pruned a pod's last volume directory left
// pods/<uid>/volumes/kubernetes.io~csi with nothing in it, which no scan
// finds as a volume. A pod directory that holds nothing but empty
// directories is removed at start; one with a file, or with a mount point
// anywhere below it, is left whole, and nothing inside a mount is touched.
func TestEmptyPodDirectoriesAreRemoved(t *testing.T) {
	f := newFixture(t)
	pods := f.layout.PodsDir()
	mkdir := func(parts ...string) string {
		t.Helper()
		dir := filepath.Join(append([]string{pods}, parts...)...)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	skeleton := mkdir("uid-skeleton", "volumes", "kubernetes.io~csi")
	mkdir("uid-skeleton", "volumeDevices", "kubernetes.io~csi")
	withFile := mkdir("uid-file", "volumes", "kubernetes.io~csi", "pv-a")
	if err := os.WriteFile(filepath.Join(withFile, "somebody's file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A mounted target whose volume holds only an empty directory: the
	// volume's data, not a leftover.
	target := filepath.Join(mkdir("uid-mounted", "volumes", "kubernetes.io~csi", "pv-b"), "mount")
	f.bindMount(target)
	inVolume := filepath.Join(target, "empty-dir-of-the-user")
	if err := os.Mkdir(inVolume, 0o750); err != nil {
		t.Fatal(err)
	}

	_, ctx := ktesting.NewTestContext(t)
	res, err := Run(ctx, f.layout, f.mounter, asw.New(asw.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pods, "uid-skeleton")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the pod directory of empty directories %s: %v, want it removed", skeleton, err)
	}
	for _, path := range []string{withFile, inVolume} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s: %v, want it left alone", path, err)
		}
	}
	if res.Removed != 1 {
		t.Errorf("Removed %d, want 1 (the empty pod directory)", res.Removed)
	}
}
