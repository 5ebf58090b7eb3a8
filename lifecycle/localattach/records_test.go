package localattach

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
)

// v0Attachment is an attachment record as csi-volmgr wrote it before
// records were versioned (commit 605f0bf5).
const v0Attachment = `{"volume":"kubernetes.io/csi/d.example.com^vol-1","driver":"d.example.com","volumeHandle":"vol-1","nodeID":"node-1","pvName":"pv-1"}`

func newTestStore(t *testing.T) *recordStore {
	t.Helper()
	s, err := newRecordStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		t.Fatal(err)
	}
	return s
}

func formatOfFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	s, _ := m[checkpoint.FormatKey].(string)
	return s
}

func TestAttachmentRecordsCarryTheirFormat(t *testing.T) {
	s := newTestStore(t)
	if err := s.write("va-1", record{Volume: "v", Driver: "d", Handle: "h", NodeID: "n"}); err != nil {
		t.Fatal(err)
	}
	if got := formatOfFile(t, s.path("va-1")); got != "1" {
		t.Errorf("%s = %q, want \"1\"", checkpoint.FormatKey, got)
	}
}

// TestOlderAttachmentRecordsAreMigrated: a record without a version is
// loaded as before, left as it is by list, and rewritten with the current
// version by migrate.
func TestOlderAttachmentRecordsAreMigrated(t *testing.T) {
	s := newTestStore(t)
	if err := os.WriteFile(s.path("va-1"), []byte(v0Attachment), 0o640); err != nil {
		t.Fatal(err)
	}
	got, err := s.list()
	if err != nil {
		t.Fatal(err)
	}
	r := got["va-1"]
	if r.Volume != "kubernetes.io/csi/d.example.com^vol-1" || r.Handle != "vol-1" || r.NodeID != "node-1" || r.PVName != "pv-1" {
		t.Errorf("loaded %+v", r)
	}
	if data, _ := os.ReadFile(s.path("va-1")); string(data) != v0Attachment {
		t.Errorf("list rewrote the record: %s", data)
	}
	if err := s.migrate("va-1", r); err != nil {
		t.Fatal(err)
	}
	if f := formatOfFile(t, s.path("va-1")); f != "1" {
		t.Errorf("after migrate, %s = %q, want \"1\"", checkpoint.FormatKey, f)
	}
	again, err := s.read("va-1")
	if err != nil || again.Handle != r.Handle || again.Volume != r.Volume {
		t.Errorf("migrated record reads as %+v, %v", again, err)
	}
}

// TestNewerAttachmentRecordIsRefused: one record of a newer format makes
// list fail with a *checkpoint.FormatError naming it, and no record,
// the older ones included, is rewritten.
func TestNewerAttachmentRecordIsRefused(t *testing.T) {
	s := newTestStore(t)
	newer := `{"csiVolmgrFormat":"2","volume":"v","driver":"d","volumeHandle":"h","nodeID":"n"}`
	files := map[string]string{s.path("va-old"): v0Attachment, s.path("va-new"): newer}
	for p, data := range files {
		if err := os.WriteFile(p, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.list()
	var fe *checkpoint.FormatError
	if !errors.As(err, &fe) || fe.Path != s.path("va-new") || fe.Found != "2" || fe.Known != checkpoint.FormatVersion {
		t.Fatalf("list = %v, want a *checkpoint.FormatError for %s", err, s.path("va-new"))
	}
	if _, err := s.read("va-new"); !errors.Is(err, checkpoint.ErrNewerFormat) {
		t.Errorf("read = %v, want ErrNewerFormat", err)
	}
	for p, data := range files {
		if got, _ := os.ReadFile(p); string(got) != data {
			t.Errorf("%s changed: %s", filepath.Base(p), got)
		}
	}
}
