package paths_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

const root = "/var/lib/csi-volmgr"

func layout(t testing.TB, root string) paths.Layout {
	t.Helper()
	l, err := paths.New(root)
	if err != nil {
		t.Fatalf("New(%q): %v", root, err)
	}
	return l
}

func TestNewRejectsRelativeRoots(t *testing.T) {
	for _, r := range []string{"", "relative/dir", "./x", "/a\x00b"} {
		if _, err := paths.New(r); !errors.Is(err, volume.ErrInvalidName) {
			t.Errorf("New(%q) = %v, want ErrInvalidName", r, err)
		}
	}
	l := layout(t, "/var/lib/csi-volmgr/")
	if l.Root() != root {
		t.Errorf("Root() = %q, want the cleaned %q", l.Root(), root)
	}
}

// TestKubeletPaths pins the paths to the kubelet's (pkg/volume/csi: csi_attacher.go makeDeviceMountPath, csi_mounter.go getTargetPath, csi_block.go).
func TestKubeletPaths(t *testing.T) {
	l := layout(t, root)
	// printf vol-1 | sha256sum
	const h = "d2e8363faaac7ae76def3b14091d8eb5755f6b92e9531627aeec833a8731cc49"
	if got := paths.HandleHash("vol-1"); got != h {
		t.Fatalf("HandleHash(vol-1) = %q, want %q", got, h)
	}

	fs, err := l.Staging(volume.ID{Driver: "hostpath.csi.k8s.io", Handle: "vol-1", AccessType: volume.Filesystem})
	if err != nil {
		t.Fatal(err)
	}
	wantDir := root + "/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/" + h
	if fs.Dir != wantDir || fs.Path != wantDir+"/globalmount" || fs.Record != wantDir+"/vol_data.json" {
		t.Errorf("filesystem Staging = %+v, want dir %s with globalmount and vol_data.json", fs, wantDir)
	}

	blk, err := l.Staging(volume.ID{Driver: "hostpath.csi.k8s.io", Handle: "vol-1", PVName: "pv-1", AccessType: volume.Block})
	if err != nil {
		t.Fatal(err)
	}
	if blk.Dir != wantDir || blk.Record != wantDir+"/vol_data.json" ||
		blk.Path != root+"/plugins/kubernetes.io/csi/volumeDevices/staging/pv-1" ||
		blk.MapDir != root+"/plugins/kubernetes.io/csi/volumeDevices/pv-1/dev" {
		t.Errorf("block Staging = %+v", blk)
	}

	pub, err := l.Publishing("uid-1", "pv-1", volume.Filesystem)
	if err != nil {
		t.Fatal(err)
	}
	wantPub := root + "/pods/uid-1/volumes/kubernetes.io~csi/pv-1"
	if pub.Dir != wantPub || pub.Target != wantPub+"/mount" || pub.Record != wantPub+"/vol_data.json" {
		t.Errorf("filesystem Publishing = %+v, want dir %s", pub, wantPub)
	}

	bpub, err := l.Publishing("uid-1", "pv-1", volume.Block)
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet's block layout (csi_block.go): the pod's device is a
	// symbolic link in the pod directory, the global map holds one bind
	// mount per pod; the record is kept beside the global map.
	if bpub.Dir != root+"/plugins/kubernetes.io/csi/volumeDevices/pv-1/data/uid-1" ||
		bpub.Record != bpub.Dir+"/vol_data.json" ||
		bpub.Target != root+"/plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/uid-1" ||
		bpub.DeviceLink != root+"/pods/uid-1/volumeDevices/kubernetes.io~csi/pv-1" ||
		bpub.MapFile != root+"/plugins/kubernetes.io/csi/volumeDevices/pv-1/dev/uid-1" {
		t.Errorf("block Publishing = %+v", bpub)
	}

	escaped, err := l.Publishing("uid-1", "a/b", volume.Filesystem)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(escaped.Dir) != "a~b" {
		t.Errorf("Publishing of \"a/b\" uses directory %q, want the escaped a~b", filepath.Base(escaped.Dir))
	}
}

func TestRejectsEscapingNames(t *testing.T) {
	l := layout(t, root)
	long := strings.Repeat("x", 256)
	for _, tc := range []struct {
		name        string
		pod         types.UID
		publishName string
	}{
		{"dot-dot name", "uid", ".."},
		{"dot name", "uid", "."},
		{"empty name", "uid", ""},
		{"absolute name", "uid", "/etc"},
		{"NUL in name", "uid", "a\x00b"},
		{"tilde in name", "uid", "a~b"},
		{"too long name", "uid", long},
		{"dot-dot pod", "..", "pv"},
		{"slash in pod", "a/b", "pv"},
		{"empty pod", "", "pv"},
		{"NUL in pod", "a\x00", "pv"},
		{"too long pod", types.UID(long), "pv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, access := range []volume.AccessType{volume.Filesystem, volume.Block} {
				p, err := l.Publishing(tc.pod, tc.publishName, access)
				if !errors.Is(err, volume.ErrInvalidName) {
					t.Errorf("Publishing(%q, %q, %v) = %+v, %v; want ErrInvalidName", tc.pod, tc.publishName, access, p, err)
				}
			}
		})
	}
	for _, src := range []volume.ID{
		{Driver: "..", Handle: "h", AccessType: volume.Filesystem},
		{Driver: "a/b", Handle: "h", AccessType: volume.Filesystem},
		{Driver: "", Handle: "h", AccessType: volume.Filesystem},
		{Driver: "volumeDevices", Handle: "h", AccessType: volume.Filesystem},
		{Driver: "d", Handle: "", AccessType: volume.Filesystem},
		{Driver: "d", Handle: "h", AccessType: 0},
		{Driver: "d", Handle: "h", AccessType: volume.Block, PVName: ""},
		{Driver: "d", Handle: "h", AccessType: volume.Block, PVName: ".."},
	} {
		if s, err := l.Staging(src); !errors.Is(err, volume.ErrInvalidName) {
			t.Errorf("Staging(%+v) = %+v, %v; want ErrInvalidName", src, s, err)
		}
	}
	// A huge handle is fine: it is hashed.
	if _, err := l.Staging(volume.ID{Driver: "d", Handle: strings.Repeat("h", 1<<16), AccessType: volume.Filesystem}); err != nil {
		t.Errorf("Staging with a 64 KiB handle: %v", err)
	}
	// ../x escapes to a single harmless component.
	p, err := l.Publishing("uid", "../x", volume.Filesystem)
	if err != nil || filepath.Dir(p.Dir) != root+"/pods/uid/volumes/kubernetes.io~csi" {
		t.Errorf("Publishing(\"../x\") = %+v, %v; want a directory inside the plugin directory", p, err)
	}
}

func TestParseRoundTrip(t *testing.T) {
	l := layout(t, root)
	for _, access := range []volume.AccessType{volume.Filesystem, volume.Block} {
		p, err := l.Publishing("uid-7", "ns/name", access)
		if err != nil {
			t.Fatal(err)
		}
		got, err := l.ParsePublishingDir(p.Dir)
		if err != nil {
			t.Fatalf("ParsePublishingDir(%s): %v", p.Dir, err)
		}
		if got.Pod != "uid-7" || got.PublishName != "ns/name" || got.AccessType != access || got.Publishing != p {
			t.Errorf("ParsePublishingDir(%s) = %+v", p.Dir, got)
		}
		got, err = l.ParseTarget(p.Target)
		if err != nil {
			t.Fatalf("ParseTarget(%s): %v", p.Target, err)
		}
		if got.Pod != "uid-7" || got.PublishName != "ns/name" || got.AccessType != access || got.Publishing != p {
			t.Errorf("ParseTarget(%s) = %+v", p.Target, got)
		}
	}
	s, err := l.Staging(volume.ID{Driver: "d.example.com", Handle: "h", AccessType: volume.Filesystem})
	if err != nil {
		t.Fatal(err)
	}
	sv, err := l.ParseStagedDir(s.Dir)
	if err != nil || sv.Driver != "d.example.com" || sv.HandleHash != paths.HandleHash("h") || sv.Dir != s.Dir || sv.Record != s.Record {
		t.Errorf("ParseStagedDir(%s) = %+v, %v", s.Dir, sv, err)
	}

	for _, bad := range []string{
		"/elsewhere/pods/u/volumes/kubernetes.io~csi/n",
		root + "/pods/u/volumes/kubernetes.io~csi",
		root + "/pods/u/volumes/other-plugin/n",
		root + "/pods/u/volumes/kubernetes.io~csi/~etc",
		root + "/pods/u/volumes/kubernetes.io~csi/n/../../../../x",
		root,
	} {
		if got, err := l.ParsePublishingDir(bad); !errors.Is(err, volume.ErrInvalidName) {
			t.Errorf("ParsePublishingDir(%q) = %+v, %v; want ErrInvalidName", bad, got, err)
		}
	}
	for _, bad := range []string{
		root + "/plugins/kubernetes.io/csi/d/not-a-hash",
		root + "/plugins/kubernetes.io/csi/volumeDevices/" + paths.HandleHash("h"),
		root + "/plugins/kubernetes.io/csi/d/" + strings.ToUpper(paths.HandleHash("h")),
	} {
		if got, err := l.ParseStagedDir(bad); !errors.Is(err, volume.ErrInvalidName) {
			t.Errorf("ParseStagedDir(%q) = %+v, %v; want ErrInvalidName", bad, got, err)
		}
	}
}

func TestScanFindsWhatWasBuilt(t *testing.T) {
	l := layout(t, t.TempDir())
	mk := func(p string) {
		t.Helper()
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := l.PodVolumes(); err != nil || len(got) != 0 {
		t.Fatalf("PodVolumes on an empty root = %v, %v", got, err)
	}
	var want []paths.Publishing
	for _, c := range []struct {
		pod    types.UID
		name   string
		access volume.AccessType
	}{{"uid-a", "pv-1", volume.Filesystem}, {"uid-a", "pv-2", volume.Block}, {"uid-b", "inline", volume.Filesystem}} {
		p, err := l.Publishing(c.pod, c.name, c.access)
		if err != nil {
			t.Fatal(err)
		}
		mk(p.Dir)
		want = append(want, p)
	}
	// Not ours: another plugin's directory, a stray file and a bad name.
	mk(filepath.Join(l.Root(), "pods/uid-a/volumes/kubernetes.io~empty-dir/cache"))
	if err := os.WriteFile(filepath.Join(l.Root(), "pods/uid-a/volumes/kubernetes.io~csi/file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mk(filepath.Join(l.Root(), "pods/uid-b/volumes/kubernetes.io~csi/~etc"))

	got, err := l.PodVolumes()
	if !errors.Is(err, volume.ErrInvalidName) {
		t.Errorf("PodVolumes error = %v, want one naming the bad directory ~etc", err)
	}
	if len(got) != len(want) {
		t.Fatalf("PodVolumes = %+v, want %d entries", got, len(want))
	}
	for i := range want {
		if got[i].Publishing != want[i] {
			t.Errorf("PodVolumes[%d] = %+v, want %+v", i, got[i].Publishing, want[i])
		}
	}

	s1, _ := l.Staging(volume.ID{Driver: "d1", Handle: "h1", AccessType: volume.Filesystem})
	s2, _ := l.Staging(volume.ID{Driver: "d2", Handle: "h2", PVName: "pv", AccessType: volume.Block})
	mk(s1.Path)
	mk(s2.Dir)
	mk(s2.Path) // volumeDevices/staging/pv must not be listed as a driver
	staged, err := l.StagedVolumes()
	if err != nil {
		t.Fatalf("StagedVolumes: %v", err)
	}
	if len(staged) != 2 || staged[0].Dir != s1.Dir || staged[1].Dir != s2.Dir || staged[1].Driver != "d2" {
		t.Errorf("StagedVolumes = %+v, want %s and %s", staged, s1.Dir, s2.Dir)
	}
}
