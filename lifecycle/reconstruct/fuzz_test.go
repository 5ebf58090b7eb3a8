package reconstruct

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
)

// nothingMounted is a mount table with no mounts.
type nothingMounted struct{}

func (nothingMounted) IsMountPoint(string) (bool, error) { return false, nil }

// FuzzReconstructRecords lays out one staged-volume directory and one pod
// volume directory (filesystem and block) with fuzzed vol_data.json
// contents, as a crash, a disk error or an attacker with access to the root
// could leave them, and rebuilds the actual state from them: it never
// panics or fails as a whole but for a record of a newer format (then it
// records nothing), and every staging and target path it records lies
// below the root, whatever path a record names.
func FuzzReconstructRecords(f *testing.F) {
	f.Add([]byte(`{"volumeHandle":"h","driverName":"d.example.com","pvName":"pv","accessType":"Filesystem","stagingPath":"/etc"}`),
		[]byte(`{"specVolID":"pv","volumeHandle":"h","driverName":"d.example.com","podUID":"uid","targetPath":"/etc/passwd"}`), false)
	f.Add([]byte(`{"volumeHandle":"../../..","driverName":"../x","pvName":"../../y","accessType":"Block"}`),
		[]byte(`{"specVolID":"../../z","volumeHandle":"h","driverName":"d","volumeName":"kubernetes.io/csi/d^h"}`), true)
	f.Add([]byte(`{"volumeHandle":"h","driverName":"d"}`), []byte(`null`), false)
	f.Add([]byte("\x00"), []byte(`{"specVolID":"pv","volumeHandle":"h","driverName":"d","accessType":"Block","podUID":"other"}`), true)
	f.Add([]byte(`{"volumeHandle":"h","driverName":"d.example.com","csiVolmgrFormat":"1"}`),
		[]byte(`{"specVolID":"pv","volumeHandle":"h","driverName":"d.example.com","csiVolmgrFormat":"2"}`), false)
	// One root for every input: a directory per input makes each run slow
	// enough to stall the fuzzer's minimization. Reconstruction writes no
	// more than a record's migration, and every input writes both records.
	root := f.TempDir()
	layout, err := paths.New(root)
	if err != nil {
		f.Fatal(err)
	}
	stagedDir := filepath.Join(layout.PluginDir(), "d.example.com", paths.HandleHash("h"))
	fsDir := filepath.Join(layout.PodsDir(), "uid", "volumes", "kubernetes.io~csi", "pv")
	blockDir := filepath.Join(layout.PodsDir(), "uid", "volumeDevices", "kubernetes.io~csi", "pv")
	f.Fuzz(func(t *testing.T, stage, publish []byte, block bool) {
		podDir, otherDir := fsDir, blockDir
		if block {
			podDir, otherDir = blockDir, fsDir
		}
		if err := os.Remove(filepath.Join(otherDir, paths.DataFileName)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for dir, data := range map[string][]byte{stagedDir: stage, podDir: publish} {
			// Reconstruction removes a directory left without a record.
			if err := os.MkdirAll(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, paths.DataFileName), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		world := asw.New(asw.Options{})
		ctx := klog.NewContext(t.Context(), logr.Discard())
		if _, err := Run(ctx, layout, nothingMounted{}, world); err != nil {
			if !errors.Is(err, checkpoint.ErrNewerFormat) {
				t.Fatalf("Run: %v", err)
			}
			if n := len(world.Snapshot()); n != 0 {
				t.Fatalf("Run refused a newer format (%v) but recorded %d volumes", err, n)
			}
		}
		for _, v := range world.Snapshot() {
			if v.StagingPath != "" && !strings.HasPrefix(v.StagingPath, root+"/") {
				t.Fatalf("volume %s recorded staged at %q, outside the root", v.Name, v.StagingPath)
			}
			for _, p := range v.Pods {
				if p.TargetPath != "" && (!strings.HasPrefix(p.TargetPath, root+"/") || filepath.Clean(p.TargetPath) != p.TargetPath) {
					t.Fatalf("pod %s of %s recorded published at %q, outside the root", p.Key.Pod, v.Name, p.TargetPath)
				}
			}
		}
	})
}
