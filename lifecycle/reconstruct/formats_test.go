package reconstruct

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
)

// setFormat rewrites the record's format version: "" removes it (a record
// of csi-volmgr before versioned records).
func setFormat(t *testing.T, path, version string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(data), `"`+checkpoint.FormatKey+`":"1",`, "", 1)
	if version != "" {
		s = strings.Replace(s, "{", `{"`+checkpoint.FormatKey+`":"`+version+`",`, 1)
	}
	if err := os.WriteFile(path, []byte(s), 0o640); err != nil {
		t.Fatal(err)
	}
}

// snapshotFiles returns every file below root with its content, every
// directory with "".
func snapshotFiles(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[path] = ""
			return nil
		}
		data, err := os.ReadFile(path)
		out[path] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNewerFormatStopsTheReconstructionBeforeAnythingChanges: one record
// of a newer format among older ones, a pod volume directory left empty by
// an interrupted step (which reconstruction removes) and an empty pod
// directory: Run fails naming the record, records nothing, migrates
// nothing and removes nothing.
func TestNewerFormatStopsTheReconstructionBeforeAnythingChanges(t *testing.T) {
	f := newFixture(t)
	f.staged("old", true)
	f.published("old", "a", true)
	f.staged("newer", false)
	newer := f.published("newer", "b", false)
	var newerRecord, oldRecord string
	for _, dir := range []string{"uid-a", "uid-b"} {
		record := filepath.Join(f.layout.PodsDir(), dir, "volumes", "kubernetes.io~csi", "pv-"+map[string]string{"uid-a": "old", "uid-b": "newer"}[dir], "vol_data.json")
		if dir == "uid-b" {
			newerRecord = record
			setFormat(t, record, "2")
		} else {
			oldRecord = record
			setFormat(t, record, "")
		}
	}
	// What reconstruction would otherwise remove: a directory without a
	// record, and an empty pod directory.
	if err := os.MkdirAll(filepath.Join(f.layout.PodsDir(), "uid-c", "volumes", "kubernetes.io~csi", "pv-gone"), 0o750); err != nil {
		t.Fatal(err)
	}
	before := snapshotFiles(t, f.layout.Root())

	_, ctx := ktesting.NewTestContext(t)
	world := asw.New(asw.Options{})
	_, err := Run(ctx, f.layout, f.mounter, world)
	var fe *checkpoint.FormatError
	if !errors.As(err, &fe) || fe.Path != newerRecord || fe.Found != "2" {
		t.Fatalf("Run = %v, want a *FormatError for %s", err, newerRecord)
	}
	if n := len(world.Snapshot()); n != 0 {
		t.Errorf("the actual state holds %d volumes after a refused reconstruction", n)
	}
	if _, ok := world.Pod(newer); ok {
		t.Errorf("the newer record's publish was recorded")
	}
	after := snapshotFiles(t, f.layout.Root())
	for path, data := range before {
		if got, ok := after[path]; !ok || got != data {
			t.Errorf("%s changed (present %v): %q, was %q", path, ok, got, data)
		}
	}
	if len(after) != len(before) {
		t.Errorf("files and directories: %d after, %d before", len(after), len(before))
	}
	if v, err := checkpoint.CheckFormat(oldRecord); err != nil || v != 0 {
		t.Errorf("the older record was migrated (%d, %v) although the reconstruction was refused", v, err)
	}
}

// TestNewerFrontRecordStopsTheReconstruction: the front endpoint's records
// are checked with the others, before anything is reconstructed.
func TestNewerFrontRecordStopsTheReconstruction(t *testing.T) {
	f := newFixture(t)
	f.staged("kubelet-layout", false)
	cv, err := f.layout.CallerVolume(driver, "front-vol")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.WriteStage(cv.StageRecord, checkpoint.StageRecord{
		VolumeHandle: "front-vol", DriverName: driver, StagingPath: "/somewhere/staging",
	}); err != nil {
		t.Fatal(err)
	}
	setFormat(t, cv.StageRecord, "3")
	_, ctx := ktesting.NewTestContext(t)
	world := asw.New(asw.Options{})
	_, err = Run(ctx, f.layout, f.mounter, world)
	var fe *checkpoint.FormatError
	if !errors.As(err, &fe) || fe.Path != cv.StageRecord || fe.Found != "3" {
		t.Fatalf("Run = %v, want a *FormatError for %s", err, cv.StageRecord)
	}
	if n := len(world.Snapshot()); n != 0 {
		t.Errorf("the actual state holds %d volumes after a refused reconstruction", n)
	}
}

// TestOlderRecordsAreMigratedOnReconstruction: the records a previous
// version wrote are reconstructed as before and then carry the current
// format; a second start migrates nothing.
func TestOlderRecordsAreMigratedOnReconstruction(t *testing.T) {
	f := newFixture(t)
	stagedName := f.staged("v", true)
	key := f.published("v", "a", true)
	var records []string
	err := filepath.WalkDir(f.layout.Root(), func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "vol_data.json" {
			records = append(records, path)
			setFormat(t, path, "")
		}
		return err
	})
	if err != nil || len(records) != 2 {
		t.Fatalf("records %v, %v", records, err)
	}

	_, ctx := ktesting.NewTestContext(t)
	world := asw.New(asw.Options{})
	res, err := Run(ctx, f.layout, f.mounter, world)
	if err != nil {
		t.Fatal(err)
	}
	if res.ProvenStaged != 1 || res.ProvenPublished != 1 || res.Migrated != 2 || len(res.Failed) != 0 {
		t.Errorf("result = %+v, want 1 staged and 1 published, intact, 2 migrated", res)
	}
	if _, ok := world.Volume(stagedName); !ok {
		t.Errorf("volume %s not reconstructed", stagedName)
	}
	if _, ok := world.Pod(key); !ok {
		t.Errorf("pod %s not reconstructed", key)
	}
	for _, r := range records {
		if v, err := checkpoint.CheckFormat(r); err != nil || v != checkpoint.FormatVersion {
			t.Errorf("%s: format %d, %v after reconstruction; want %d", r, v, err, checkpoint.FormatVersion)
		}
	}
	res, err = Run(ctx, f.layout, f.mounter, asw.New(asw.Options{}))
	if err != nil || res.Migrated != 0 {
		t.Errorf("second start: migrated %d, %v; want 0", res.Migrated, err)
	}
}
