package paths_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// below reports whether p is strictly below root.
func below(root, p string) bool {
	return p == filepath.Clean(p) && strings.HasPrefix(p, root+"/") && len(p) > len(root)+1
}

// FuzzPublishing checks that every path Publishing builds lies below the
// root, parses back into the parts it was built from, and that a name that
// cannot be one path component is an ErrInvalidName error and no path.
func FuzzPublishing(f *testing.F) {
	for _, seed := range []struct{ pod, name string }{
		{"uid-1", "pv-1"}, {"uid", ".."}, {"uid", "../../etc"}, {"..", "pv"}, {"uid", "/abs"},
		{"uid", "a/b"}, {"uid", "a~b"}, {"uid", "~etc"}, {"u/v", "pv"}, {"uid", "a\x00"}, {"", ""},
		{"uid", strings.Repeat("n", 256)}, {"uid", "."}, {"uid", "a/"}, {"uid", "//"},
	} {
		f.Add(seed.pod, seed.name, true)
		f.Add(seed.pod, seed.name, false)
	}
	l := layout(f, root)
	f.Fuzz(func(t *testing.T, pod, name string, block bool) {
		access := volume.Filesystem
		if block {
			access = volume.Block
		}
		p, err := l.Publishing(types.UID(pod), name, access)
		if err != nil {
			if !errors.Is(err, volume.ErrInvalidName) {
				t.Fatalf("Publishing(%q, %q) error %v does not wrap ErrInvalidName", pod, name, err)
			}
			if p != (paths.Publishing{}) {
				t.Fatalf("Publishing(%q, %q) returned paths %+v with error %v", pod, name, p, err)
			}
			return
		}
		for _, path := range []string{p.Dir, p.Record, p.Target} {
			if !below(root, path) {
				t.Fatalf("Publishing(%q, %q) built %q, not below %s", pod, name, path, root)
			}
		}
		for what, parse := range map[string]func() (paths.PodVolume, error){
			"dir":    func() (paths.PodVolume, error) { return l.ParsePublishingDir(p.Dir) },
			"target": func() (paths.PodVolume, error) { return l.ParseTarget(p.Target) },
		} {
			got, err := parse()
			if err != nil {
				t.Fatalf("parsing the %s built from (%q, %q): %v", what, pod, name, err)
			}
			if got.Pod != types.UID(pod) || got.PublishName != name || got.AccessType != access || got.Publishing != p {
				t.Fatalf("parsing the %s built from (%q, %q, %v) gave %+v", what, pod, name, access, got)
			}
		}
	})
}

// FuzzStaging checks the same for Staging, and that ParseStagedDir accepts
// exactly the directories Staging builds.
func FuzzStaging(f *testing.F) {
	for _, seed := range []struct{ driver, handle, pv string }{
		{"d.example.com", "vol-1", "pv-1"}, {"..", "h", "pv"}, {"a/b", "h", "pv"}, {"d", "", "pv"},
		{"volumeDevices", "h", "pv"}, {"d", "h", "../x"}, {"d", "h", ".."}, {"d", strings.Repeat("h", 4096), "pv"},
	} {
		f.Add(seed.driver, seed.handle, seed.pv, true)
		f.Add(seed.driver, seed.handle, seed.pv, false)
	}
	l := layout(f, root)
	f.Fuzz(func(t *testing.T, driver, handle, pv string, block bool) {
		access := volume.Filesystem
		if block {
			access = volume.Block
		}
		s, err := l.Staging(volume.ID{Driver: driver, Handle: handle, PVName: pv, AccessType: access})
		if err != nil {
			if !errors.Is(err, volume.ErrInvalidName) || s != (paths.Staging{}) {
				t.Fatalf("Staging(%q, %q, %q) = %+v, %v; want no paths and ErrInvalidName", driver, handle, pv, s, err)
			}
			return
		}
		for _, path := range []string{s.Dir, s.Record, s.Path} {
			if !below(root, path) {
				t.Fatalf("Staging(%q, %q, %q) built %q, not below %s", driver, handle, pv, path, root)
			}
		}
		sv, err := l.ParseStagedDir(s.Dir)
		if err != nil {
			t.Fatalf("ParseStagedDir(%q): %v", s.Dir, err)
		}
		if sv.Driver != driver || sv.HandleHash != paths.HandleHash(handle) || sv.Record != s.Record {
			t.Fatalf("ParseStagedDir(%q) = %+v", s.Dir, sv)
		}
	})
}

// FuzzParse feeds arbitrary paths to the parsers: whatever they accept must
// be below the root and be rebuilt into the very same path.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		root + "/pods/u/volumes/kubernetes.io~csi/n", root + "/pods/u/volumes/kubernetes.io~csi/n/mount",
		root + "/pods/u/volumeDevices/kubernetes.io~csi/n", root + "/plugins/kubernetes.io/csi/volumeDevices/publish/n/u",
		root + "/pods/u/volumes/kubernetes.io~csi/../../../etc", root + "/plugins/kubernetes.io/csi/d/" + paths.HandleHash("h"),
		"/etc/passwd", root, root + "/", "relative/path",
	} {
		f.Add(seed)
	}
	l := layout(f, root)
	f.Fuzz(func(t *testing.T, in string) {
		if pv, err := l.ParsePublishingDir(in); err == nil {
			if !below(root, pv.Dir) || pv.Dir != filepath.Clean(in) {
				t.Fatalf("ParsePublishingDir(%q) accepted it as %q", in, pv.Dir)
			}
		} else if !errors.Is(err, volume.ErrInvalidName) {
			t.Fatalf("ParsePublishingDir(%q) error %v does not wrap ErrInvalidName", in, err)
		}
		if pv, err := l.ParseTarget(in); err == nil {
			if !below(root, pv.Target) || pv.Target != filepath.Clean(in) {
				t.Fatalf("ParseTarget(%q) accepted it as %q", in, pv.Target)
			}
		} else if !errors.Is(err, volume.ErrInvalidName) {
			t.Fatalf("ParseTarget(%q) error %v does not wrap ErrInvalidName", in, err)
		}
		if sv, err := l.ParseStagedDir(in); err == nil {
			if !below(root, sv.Dir) || sv.Dir != filepath.Clean(in) {
				t.Fatalf("ParseStagedDir(%q) accepted it as %q", in, sv.Dir)
			}
		} else if !errors.Is(err, volume.ErrInvalidName) {
			t.Fatalf("ParseStagedDir(%q) error %v does not wrap ErrInvalidName", in, err)
		}
	})
}
