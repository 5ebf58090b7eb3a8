package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/source/manifests"
)

// v0Attachment is a standalone attachment record as csi-volmgr wrote it
// before records were versioned (commit 605f0bf5).
const v0Attachment = `{"volume":"kubernetes.io/csi/d.example.com^vol-1","driver":"d.example.com","volumeHandle":"vol-1","nodeID":"node-1","pvName":"pv-1"}`

// standaloneRoot returns a root directory holding an attachment record of
// the format before versions, and the record's path.
func standaloneRoot(t *testing.T) (root, attachment string) {
	t.Helper()
	root = t.TempDir()
	attachment = filepath.Join(root, "standalone", "attachments", "csi-0123abcd.json")
	if err := os.MkdirAll(filepath.Dir(attachment), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(attachment, []byte(v0Attachment), 0o640); err != nil {
		t.Fatal(err)
	}
	return root, attachment
}

func newStandaloneManager(ctx context.Context, t *testing.T, root string) *Manager {
	t.Helper()
	src, err := manifests.New(ctx, manifests.Config{Dir: t.TempDir(), NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(ctx, Config{Standalone: src, NodeName: "node-a", RootDir: root, Drivers: noDrivers{}, Policies: defaultPolicies{}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestNewerVolumeRecordStopsTheAttachmentRecordsMigration: in standalone
// mode a pod volume record of a newer format (a rollback) stops the agent
// before it rewrites anything, its attachment records of the older format
// included.
func TestNewerVolumeRecordStopsTheAttachmentRecordsMigration(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root, attachment := standaloneRoot(t)
	record := filepath.Join(root, "pods", "pod-1", "volumes", "kubernetes.io~csi", "pv-1", "vol_data.json")
	if err := os.MkdirAll(filepath.Dir(record), 0o750); err != nil {
		t.Fatal(err)
	}
	newer := `{"` + checkpoint.FormatKey + `":"2","driverName":"d.example.com","volumeHandle":"vol-1","specVolID":"pv-1"}`
	if err := os.WriteFile(record, []byte(newer), 0o640); err != nil {
		t.Fatal(err)
	}
	m := newStandaloneManager(ctx, t, root)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := m.Run(ctx)
	if !errors.Is(err, checkpoint.ErrNewerFormat) {
		t.Fatalf("Run = %v, want the newer format refused", err)
	}
	if got, _ := os.ReadFile(attachment); string(got) != v0Attachment {
		t.Errorf("the attachment record was rewritten by an agent that refused to start:\n got %s\nwant %s", got, v0Attachment)
	}
}

// TestOlderAttachmentRecordsMigratedAfterTheReconstruction: with no record
// of a newer format, the attachment records of the older format are
// rewritten in the current one and counted with the volume records.
func TestOlderAttachmentRecordsMigratedAfterTheReconstruction(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root, attachment := standaloneRoot(t)
	m := newStandaloneManager(ctx, t, root)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-m.Reconstructed():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the actual state was never rebuilt")
	}
	if got := m.Reconstruction().Migrated; got != 1 {
		t.Errorf("Reconstruction().Migrated = %d, want the 1 attachment record", got)
	}
	got, err := os.ReadFile(attachment)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), `"`+checkpoint.FormatKey+`":"1"`) || !strings.Contains(string(got), `"volumeHandle":"vol-1"`) {
		t.Errorf("the attachment record after the start: %s", got)
	}
}
