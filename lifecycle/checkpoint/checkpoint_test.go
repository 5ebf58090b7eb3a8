package checkpoint_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

func TestPublishRecordRoundTripInKubeletFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods", "uid-1", "volumes", "kubernetes.io~csi", "pv-1", "vol_data.json")
	want := checkpoint.PublishRecord{
		SpecVolID:           "pv-1",
		VolumeHandle:        "vol-1",
		DriverName:          "d.example.com",
		NodeName:            "node-1",
		AttachmentID:        volume.AttachmentName("vol-1", "d.example.com", "node-1"),
		VolumeLifecycleMode: storagev1.VolumeLifecyclePersistent,
		VolumeName:          volume.PersistentName("d.example.com", "vol-1"),
		PodUID:              "uid-1",
		AccessType:          volume.Filesystem,
		TargetPath:          "/root/pods/uid-1/volumes/kubernetes.io~csi/pv-1/mount",
	}
	if err := checkpoint.WritePublish(path, want); err != nil {
		t.Fatalf("WritePublish: %v", err)
	}
	got, err := checkpoint.ReadPublish(path)
	if err != nil {
		t.Fatalf("ReadPublish: %v", err)
	}
	if got != want {
		t.Errorf("ReadPublish = %+v, want %+v", got, want)
	}

	// The kubelet's loadVolumeData decodes a map[string]string.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var kubelet map[string]string
	if err := json.Unmarshal(data, &kubelet); err != nil {
		t.Fatalf("the kubelet could not read %s: %v", data, err)
	}
	for k, v := range map[string]string{
		"specVolID": "pv-1", "volumeHandle": "vol-1", "driverName": "d.example.com", "nodeName": "node-1",
		"attachmentID": want.AttachmentID, "volumeLifecycleMode": "Persistent",
	} {
		if kubelet[k] != v {
			t.Errorf("key %q = %q, want %q (the kubelet's format)", k, kubelet[k], v)
		}
	}
	if _, ok := kubelet["seLinuxMountContext"]; ok {
		t.Errorf("empty seLinuxMountContext was written: %s", data)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("record directory mode = %v, %v; want 0750", fi.Mode().Perm(), err)
	}
}

func TestStageRecordRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vol_data.json")
	want := checkpoint.StageRecord{
		VolumeHandle: "vol-1",
		DriverName:   "d.example.com",
		VolumeName:   volume.PersistentName("d.example.com", "vol-1"),
		PVName:       "pv-1",
		AccessType:   volume.Block,
		StagingPath:  "/root/plugins/kubernetes.io/csi/volumeDevices/staging/pv-1",
	}
	if err := checkpoint.WriteStage(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := checkpoint.ReadStage(path)
	if err != nil || got != want {
		t.Errorf("ReadStage = %+v, %v; want %+v", got, err, want)
	}
	// Overwriting replaces the content and leaves no temporary files.
	want.StagingPath = "/elsewhere"
	if err := checkpoint.WriteStage(path, want); err != nil {
		t.Fatal(err)
	}
	if got, err := checkpoint.ReadStage(path); err != nil || got.StagingPath != "/elsewhere" {
		t.Errorf("after rewrite ReadStage = %+v, %v", got, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after two writes, want only the record", len(entries))
	}
}

func TestReadersTolerateUnknownKeysAndKubeletRecords(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vol_data.json")
	// Written by a kubelet (no csi-volmgr keys), with a key of a future version that is not a string.
	data := `{"specVolID":"pv","volumeHandle":"h","driverName":"d","nodeName":"n","attachmentID":"a",` +
		`"volumeLifecycleMode":"Persistent","seLinuxMountContext":"system_u:object_r:x","future":{"nested":[1,2]}}`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := checkpoint.ReadPublish(path)
	if err != nil {
		t.Fatalf("ReadPublish of a kubelet record: %v", err)
	}
	if got.VolumeHandle != "h" || got.SELinuxMountContext != "system_u:object_r:x" || got.AccessType != 0 || got.TargetPath != "" {
		t.Errorf("ReadPublish = %+v", got)
	}
	if _, err := checkpoint.ReadStage(path); err != nil {
		t.Errorf("ReadStage with extra keys: %v", err)
	}
}

func TestReadersReportCorruptRecords(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"empty":            ``,
		"truncated":        `{"volumeHandle":"h","driverN`,
		"not an object":    `["volumeHandle"]`,
		"null":             `null`,
		"missing driver":   `{"volumeHandle":"h","specVolID":"pv"}`,
		"number handle":    `{"volumeHandle":7,"driverName":"d","specVolID":"pv"}`,
		"bad access type":  `{"volumeHandle":"h","driverName":"d","specVolID":"pv","accessType":"Tape"}`,
		"empty handle":     `{"volumeHandle":"","driverName":"d","specVolID":"pv"}`,
		"binary garbage":   "\x00\x01\x02",
		"missing specVoID": `{"volumeHandle":"h","driverName":"d"}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := checkpoint.ReadPublish(path)
			if !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("ReadPublish = %v, want ErrCorrupt", err)
			}
			if !filepathMentioned(err, path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
	if _, err := checkpoint.ReadStage(filepath.Join(dir, "missing.json")); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, checkpoint.ErrCorrupt) {
		t.Errorf("ReadStage of a missing file = %v, want fs.ErrNotExist", err)
	}
}

func filepathMentioned(err error, path string) bool {
	return err != nil && strings.Contains(err.Error(), path)
}

func TestRemoveDeletesRecordAndLeftovers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vol_data.json")
	if err := checkpoint.WriteStage(path, checkpoint.StageRecord{VolumeHandle: "h", DriverName: "d"}); err != nil {
		t.Fatal(err)
	}
	// A write interrupted by a crash leaves its temporary file.
	if err := os.WriteFile(filepath.Join(dir, ".vol_data.json.tmp-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.Remove(path); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("directory still holds %v", entries)
	}
	if err := os.Remove(dir); err != nil {
		t.Errorf("the emptied directory cannot be removed: %v", err)
	}
	if err := checkpoint.Remove(path); err != nil {
		t.Errorf("Remove of a missing record = %v, want nil", err)
	}
}

func TestMkdirAll(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "c")
	if err := checkpoint.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), dir} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() || fi.Mode().Perm() != checkpoint.DirMode {
			t.Errorf("%s: %v, %v; want a directory with mode 0750", d, fi, err)
		}
	}
	if err := checkpoint.MkdirAll(dir); err != nil {
		t.Errorf("MkdirAll of an existing directory: %v", err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := checkpoint.MkdirAll(filepath.Join(file, "sub")); err == nil {
		t.Error("MkdirAll below a file succeeded")
	}
}

// TestReplaceFile: the non-durable write replaces the content whole,
// creates missing parents with DirMode and leaves no temporary file.
func TestReplaceFile(t *testing.T) {
	base := t.TempDir()
	path := filepath.Join(base, "pods", "uid", "vol_data.json")
	for _, content := range []string{`{"a":"1"}`, `{"b":"2"}`} {
		if err := checkpoint.ReplaceFile(path, []byte(content)); err != nil {
			t.Fatalf("ReplaceFile: %v", err)
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != content {
			t.Errorf("content = %q, %v; want %q", got, err, content)
		}
	}
	if entries, err := os.ReadDir(filepath.Dir(path)); err != nil || len(entries) != 1 {
		t.Errorf("directory holds %v (err %v), want only the record", entries, err)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != checkpoint.DirMode {
		t.Errorf("parent directory: %v, %v; want mode 0750", fi, err)
	}
	if err := checkpoint.ReplaceFile(filepath.Join(path, "below-a-file"), nil); err == nil {
		t.Error("ReplaceFile below a file succeeded")
	}
}
