package checkpoint_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// v0Publish is a publish record as csi-volmgr wrote it before records were
// versioned (commit 605f0bf5): the same keys, no csiVolmgrFormat.
const v0Publish = `{"accessType":"Filesystem","driverName":"d.example.com","nodeName":"node-1","podUID":"uid-1",` +
	`"specVolID":"pv-1","targetPath":"/root/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount",` +
	`"volumeHandle":"vol-1","volumeLifecycleMode":"Persistent","volumeName":"kubernetes.io/csi/d.example.com^vol-1"}` + "\n"

func writeRaw(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o640); err != nil {
		t.Fatal(err)
	}
}

func readKeys(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Every value a string: the kubelet's loadVolumeData decodes a
	// map[string]string, and so may any older reader.
	var m map[string]string
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s is not a JSON object of strings: %v: %s", path, err, data)
	}
	return m
}

func TestRecordsAreWrittenWithTheirFormatVersion(t *testing.T) {
	dir := t.TempDir()
	pub, stage := filepath.Join(dir, "pub", "vol_data.json"), filepath.Join(dir, "stage", "vol_data.json")
	if err := checkpoint.WritePublish(pub, checkpoint.PublishRecord{SpecVolID: "pv-1", VolumeHandle: "vol-1", DriverName: "d.example.com"}); err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.WriteStage(stage, checkpoint.StageRecord{VolumeHandle: "vol-1", DriverName: "d.example.com"}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{pub, stage} {
		if got := readKeys(t, path)[checkpoint.FormatKey]; got != "1" {
			t.Errorf("%s: %s = %q, want \"1\"", path, checkpoint.FormatKey, got)
		}
		if v, err := checkpoint.CheckFormat(path); err != nil || v != checkpoint.FormatVersion {
			t.Errorf("CheckFormat(%s) = %d, %v; want %d", path, v, err, checkpoint.FormatVersion)
		}
	}
}

// TestNewerFormatIsRefusedAndLeftAlone: a record an agent of a later
// format wrote is refused by every reader with an error that names the
// file, the version found and the version known, and Migrate does not
// rewrite it.
func TestNewerFormatIsRefusedAndLeftAlone(t *testing.T) {
	for name, value := range map[string]string{
		"next version":   `"2"`,
		"far future":     `"17"`,
		"not a number":   `"v2"`,
		"not a string":   `2`,
		"padded":         `"01"`,
		"negative":       `"-1"`,
		"an object here": `{"major":2}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "vol_data.json")
			data := strings.TrimSuffix(v0Publish, "}\n") + `,"csiVolmgrFormat":` + value + "}\n"
			writeRaw(t, path, data)
			check := func(what string, err error) {
				t.Helper()
				var fe *checkpoint.FormatError
				if !errors.As(err, &fe) || !errors.Is(err, checkpoint.ErrNewerFormat) {
					t.Fatalf("%s: error %v, want a *FormatError", what, err)
				}
				if fe.Path != path || fe.Known != checkpoint.FormatVersion || !strings.Contains(value, strings.Trim(fe.Found, `"`)) {
					t.Errorf("%s: %+v, want path %s, found %s, known %d", what, fe, path, value, checkpoint.FormatVersion)
				}
				for _, want := range []string{path, "format version", "knows versions up to 1"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s: message %q does not say %q", what, err, want)
					}
				}
			}
			_, err := checkpoint.ReadPublish(path)
			check("ReadPublish", err)
			_, err = checkpoint.ReadStage(path)
			check("ReadStage", err)
			_, err = checkpoint.CheckFormat(path)
			check("CheckFormat", err)
			migrated, err := checkpoint.Migrate(path)
			check("Migrate", err)
			if migrated {
				t.Error("Migrate says it rewrote a newer record")
			}
			if after, _ := os.ReadFile(path); string(after) != data {
				t.Errorf("the record changed:\n got %s\nwant %s", after, data)
			}
		})
	}
}

// TestOlderFormatIsReadAndMigratedInPlace: a record without a version
// (csi-volmgr before versioned records, or the kubelet) is read as it is,
// and Migrate adds the version keeping every key, the unknown ones too.
func TestOlderFormatIsReadAndMigratedInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vol_data.json")
	old := strings.TrimSuffix(v0Publish, "}\n") + `,"someoneElses":"kept"}` + "\n"
	writeRaw(t, path, old)
	want := checkpoint.PublishRecord{
		SpecVolID: "pv-1", VolumeHandle: "vol-1", DriverName: "d.example.com", NodeName: "node-1",
		VolumeLifecycleMode: storagev1.VolumeLifecyclePersistent, VolumeName: volume.PersistentName("d.example.com", "vol-1"),
		PodUID: "uid-1", AccessType: volume.Filesystem, TargetPath: "/root/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount",
	}
	if got, err := checkpoint.ReadPublish(path); err != nil || got != want {
		t.Fatalf("ReadPublish of an unversioned record = %+v, %v; want %+v", got, err, want)
	}
	if v, err := checkpoint.CheckFormat(path); err != nil || v != 0 {
		t.Fatalf("CheckFormat = %d, %v; want 0", v, err)
	}

	migrated, err := checkpoint.Migrate(path)
	if err != nil || !migrated {
		t.Fatalf("Migrate = %v, %v; want true, nil", migrated, err)
	}
	before := readKeysOf(t, old)
	after := readKeys(t, path)
	if after[checkpoint.FormatKey] != "1" {
		t.Errorf("migrated record has %s = %q, want \"1\"", checkpoint.FormatKey, after[checkpoint.FormatKey])
	}
	delete(after, checkpoint.FormatKey)
	if len(after) != len(before) {
		t.Errorf("migration changed the keys: %v, was %v", after, before)
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("key %s = %q after migration, was %q", k, after[k], v)
		}
	}
	if got, err := checkpoint.ReadPublish(path); err != nil || got != want {
		t.Errorf("ReadPublish of the migrated record = %+v, %v; want %+v", got, err, want)
	}
	// Once is enough: a current record is not written again.
	data, _ := os.ReadFile(path)
	if migrated, err := checkpoint.Migrate(path); err != nil || migrated {
		t.Errorf("second Migrate = %v, %v; want false, nil", migrated, err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(data) {
		t.Errorf("second Migrate rewrote the record: %s", again)
	}
}

func readKeysOf(t *testing.T, data string) map[string]string {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMigrationInterruptedByACrash: an agent killed while it migrated a
// record leaves the old record and a temporary file beside it (killed
// before the rename), possibly half written. The next start reads the old
// record, never the temporary file, and migrates it again; the temporary
// file goes with the record's removal.
func TestMigrationInterruptedByACrash(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vol_data.json")
	writeRaw(t, path, v0Publish)
	leftover := filepath.Join(dir, ".vol_data.json.tmp-12345")
	writeRaw(t, leftover, `{"csiVolmgrFormat":"1","specVolID":"pv-1","volu`)

	if _, err := checkpoint.ReadPublish(path); err != nil {
		t.Fatalf("ReadPublish beside a half-written temporary file: %v", err)
	}
	migrated, err := checkpoint.Migrate(path)
	if err != nil || !migrated {
		t.Fatalf("Migrate after a crash = %v, %v", migrated, err)
	}
	if got := readKeys(t, path)[checkpoint.FormatKey]; got != "1" {
		t.Errorf("%s = %q after the second migration", checkpoint.FormatKey, got)
	}
	if only, err := checkpoint.RecordLeftovers(dir, path); err != nil || !only {
		t.Errorf("RecordLeftovers = %v, %v: the directory holds more than the record and its temporary files", only, err)
	}
	if err := checkpoint.Remove(path); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left after Remove: %v", entries)
	}
}
