package checkpoint_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// recordSeeds are vol_data.json contents: the kubelet's, this agent's and
// broken ones.
var recordSeeds = []string{
	`{"specVolID":"pv","volumeHandle":"h","driverName":"d","nodeName":"n","attachmentID":"a","volumeLifecycleMode":"Persistent"}`,
	`{"specVolID":"pv","volumeHandle":"h","driverName":"d","volumeName":"kubernetes.io/csi/d^h","podUID":"u","accessType":"Block","targetPath":"/r/t"}`,
	`{"volumeHandle":"h","driverName":"d","pvName":"pv","accessType":"Filesystem","stagingPath":"/r/s"}`,
	`{"volumeHandle":7}`, `null`, `[]`, `{"volumeHandle":"h","driverName":"d","specVolID":"pv","accessType":"Tape"}`,
	"{\"volumeHandle\":\"\\u0000\",\"driverName\":\"d\",\"specVolID\":\"../../..\"}", "\xff\xfe", ``,
}

// readFuzzed writes data as the record file at path and reads it with read.
func readFuzzed[R any](t *testing.T, path string, data []byte, read func(string) (R, error)) (R, error) {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := read(path)
	if err != nil && !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("reading %q: error %v is not ErrCorrupt", data, err)
	}
	if err != nil && errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("reading an existing record: %v", err)
	}
	return r, err
}

// FuzzReadPublish: no content of a publish record (vol_data.json below a
// pod's volume directory) makes the reader panic or return anything but a
// record with its required keys or ErrCorrupt; what it reads, written again
// and read back, is the same record.
func FuzzReadPublish(f *testing.F) {
	for _, s := range recordSeeds {
		f.Add([]byte(s))
	}
	// One file for every input: a directory per input is slow enough to
	// stall the fuzzer's minimization.
	path := filepath.Join(f.TempDir(), "vol_data.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := readFuzzed(t, path, data, checkpoint.ReadPublish)
		if err != nil {
			return
		}
		if r.SpecVolID == "" || r.VolumeHandle == "" || r.DriverName == "" {
			t.Fatalf("ReadPublish(%q) = %+v without a required key", data, r)
		}
		if err := checkpoint.WritePublish(path, r); err != nil {
			t.Fatal(err)
		}
		again, err := checkpoint.ReadPublish(path)
		if err != nil || again != r {
			t.Fatalf("record %+v written and read again: %+v, %v", r, again, err)
		}
	})
}

// FuzzReadStage is FuzzReadPublish for the staged-volume record.
func FuzzReadStage(f *testing.F) {
	for _, s := range recordSeeds {
		f.Add([]byte(s))
	}
	path := filepath.Join(f.TempDir(), "vol_data.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := readFuzzed(t, path, data, checkpoint.ReadStage)
		if err != nil {
			return
		}
		if r.VolumeHandle == "" || r.DriverName == "" {
			t.Fatalf("ReadStage(%q) = %+v without a required key", data, r)
		}
		if err := checkpoint.WriteStage(path, r); err != nil {
			t.Fatal(err)
		}
		again, err := checkpoint.ReadStage(path)
		if err != nil || again != r {
			t.Fatalf("record %+v written and read again: %+v, %v", r, again, err)
		}
	})
}

// FuzzPublishRecordRoundTrip: any publish record with valid UTF-8 strings
// and the required keys reads back exactly as written.
func FuzzPublishRecordRoundTrip(f *testing.F) {
	f.Add("pv", "h", "d", "n", "u", "/r/t", true)
	f.Add("../..", "h\x00", "d/e", "", "", "", false)
	path := filepath.Join(f.TempDir(), "vol_data.json")
	f.Fuzz(func(t *testing.T, spec, handle, driver, node, pod, target string, block bool) {
		for _, s := range []string{spec, handle, driver, node, pod, target} {
			if !utf8.ValidString(s) {
				return // JSON replaces invalid UTF-8
			}
		}
		access := volume.Filesystem
		if block {
			access = volume.Block
		}
		want := checkpoint.PublishRecord{SpecVolID: spec, VolumeHandle: handle, DriverName: driver, NodeName: node,
			VolumeLifecycleMode: storagev1.VolumeLifecyclePersistent, PodUID: types.UID(pod), AccessType: access, TargetPath: target}
		if err := checkpoint.WritePublish(path, want); err != nil {
			t.Fatal(err)
		}
		got, err := checkpoint.ReadPublish(path)
		if spec == "" || handle == "" || driver == "" {
			if !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("a record without a required key read as %+v, %v", got, err)
			}
			return
		}
		if err != nil || got != want {
			t.Fatalf("ReadPublish = %+v, %v; want %+v", got, err, want)
		}
	})
}
