package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fakeELF is the smallest ELF executable header debug/elf accepts, for
// machine; with interp, it names a program interpreter (dynamically
// linked). The rest of the file is payload, so that two files differ.
func fakeELF(machine elf.Machine, interp bool, payload string) []byte {
	var buf bytes.Buffer
	hdr := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Ehsize: 64, Phentsize: 56,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	if interp {
		hdr.Phoff, hdr.Phnum = 64, 1
	}
	_ = binary.Write(&buf, binary.LittleEndian, hdr)
	if interp {
		_ = binary.Write(&buf, binary.LittleEndian, elf.Prog64{Type: uint32(elf.PT_INTERP)})
	}
	buf.WriteString(payload)
	return buf.Bytes()
}

// platformDirs writes, for amd64 and arm64, a directory with a static
// executable of that architecture at each of paths, and returns the
// platforms. The files' modes and times are the host's: the image must not
// depend on them.
func platformDirs(t *testing.T, paths []string, payload string, mode fs.FileMode, mtime time.Time) []Platform {
	t.Helper()
	root := t.TempDir()
	var plats []Platform
	for _, arch := range []string{"amd64", "arm64"} {
		dir := filepath.Join(root, "linux_"+arch)
		for _, p := range paths {
			file := filepath.Join(dir, filepath.FromSlash(p))
			if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, fakeELF(elfMachines[arch], false, arch+p+payload), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(file, mtime, mtime); err != nil {
				t.Fatal(err)
			}
		}
		plats = append(plats, Platform{Platform: v1.Platform{OS: "linux", Architecture: arch}, Dir: dir})
	}
	return plats
}

var (
	testRef     = "example.com/csi-volmgr/agent:v1.2.3"
	testCreated = time.Date(2026, 11, 27, 0, 18, 57, 0, time.UTC)
	testFiles   = []string{"/usr/local/bin/helper", "/agent"}
)

func testSpec(plats []Platform) Spec {
	return Spec{
		Ref: testRef, Created: testCreated, Files: testFiles, Entrypoint: []string{"/agent"}, User: "0:0",
		Annotations: map[string]string{"org.opencontainers.image.version": "v1.2.3"},
		Platforms:   plats,
	}
}

// buildLayout builds spec into a new layout and returns its directory and
// the index's digest.
func buildLayout(t *testing.T, spec Spec) (string, v1.Hash) {
	t.Helper()
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	if err := WriteLayout(dir, spec.Ref, idx); err != nil {
		t.Fatal(err)
	}
	digest, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return dir, digest
}

// treeOf returns every file under dir by its relative path.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		rel, _ := filepath.Rel(dir, path)
		files[rel] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestBuildIsReproducible checks that the same file contents give the same
// layout, byte for byte, whatever the source files' modes and times and
// wherever they are, and that other contents give another digest.
func TestBuildIsReproducible(t *testing.T) {
	dir1, d1 := buildLayout(t, testSpec(platformDirs(t, testFiles, "", 0o755, time.Now())))
	dir2, d2 := buildLayout(t, testSpec(platformDirs(t, testFiles, "", 0o700, time.Unix(1, 0))))
	if d1 != d2 {
		t.Errorf("two builds of the same files: index %s, then %s", d1, d2)
	}
	if t1, t2 := treeOf(t, dir1), treeOf(t, dir2); !maps.Equal(t1, t2) {
		t.Errorf("two builds of the same files wrote different layouts: %v and %v", slices.Sorted(maps.Keys(t1)), slices.Sorted(maps.Keys(t2)))
	}
	if _, d3 := buildLayout(t, testSpec(platformDirs(t, testFiles, "changed", 0o755, time.Now()))); d3 == d1 {
		t.Errorf("other file contents gave the same index %s", d3)
	}
	spec := testSpec(platformDirs(t, testFiles, "", 0o755, time.Now()))
	spec.Created = spec.Created.Add(time.Second)
	if _, d4 := buildLayout(t, spec); d4 == d1 {
		t.Errorf("another creation time gave the same index %s", d4)
	}
}

// TestBuildContents reads a built layout back: one OCI index named by the
// tag, an image per platform with the config asked for, and a layer of the
// files owned by root, sorted, dated the creation time.
func TestBuildContents(t *testing.T) {
	plats := platformDirs(t, testFiles, "", 0o700, time.Now())
	dir, digest := buildLayout(t, testSpec(plats))
	idx, tag, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tag.String() != testRef {
		t.Errorf("the layout names %s, want %s", tag, testRef)
	}
	if got, _ := idx.Digest(); got != digest {
		t.Errorf("the layout holds index %s, built %s", got, digest)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex || m.Annotations["org.opencontainers.image.version"] != "v1.2.3" {
		t.Errorf("index media type %s, annotations %v", m.MediaType, m.Annotations)
	}
	if len(m.Manifests) != len(plats) {
		t.Fatalf("%d manifests, want %d", len(m.Manifests), len(plats))
	}
	for i, desc := range m.Manifests {
		p := plats[i]
		if desc.Platform == nil || !desc.Platform.Equals(p.Platform) || desc.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest %d: platform %v, media type %s, want %s, OCI", i, desc.Platform, desc.MediaType, p.Platform)
			continue
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS != "linux" || cfg.Architecture != p.Architecture || !cfg.Created.Equal(testCreated) ||
			!slices.Equal(cfg.Config.Entrypoint, []string{"/agent"}) || cfg.Config.User != "0:0" {
			t.Errorf("%s: config %+v", p, cfg)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %d layers, %v", p, len(layers), err)
		}
		if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
			t.Errorf("%s: layer media type %s", p, mt)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, hdr.Name)
			if hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || hdr.Gname != "" || hdr.Mode != 0o755 || !hdr.ModTime.Equal(testCreated) {
				t.Errorf("%s: %s: owner %d:%d (%q:%q), mode %o, time %s", p, hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname, hdr.Mode, hdr.ModTime)
			}
			if hdr.Typeflag == tar.TypeReg {
				data, _ := io.ReadAll(tr)
				src, _ := os.ReadFile(filepath.Join(p.Dir, filepath.FromSlash(hdr.Name)))
				if !bytes.Equal(data, src) {
					t.Errorf("%s: %s differs from its source", p, hdr.Name)
				}
			}
		}
		_ = rc.Close()
		want := []string{"agent", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/helper"}
		if !slices.Equal(names, want) {
			t.Errorf("%s: layer entries %v, want %v", p, names, want)
		}
	}
}

// TestBuildRefuses checks that what cannot run on an empty base of the
// platform is refused: an executable of another architecture, a
// dynamically linked one, a file that is not an executable.
func TestBuildRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"other architecture", fakeELF(elf.EM_AARCH64, false, ""), "built for EM_AARCH64, want EM_X86_64"},
		{"dynamically linked", fakeELF(elf.EM_X86_64, true, ""), "dynamically linked"},
		{"not an executable", []byte("#!/bin/sh\necho hi\n"), "not an ELF executable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plats := platformDirs(t, []string{"/agent"}, "", 0o755, time.Now())
			if err := os.WriteFile(filepath.Join(plats[0].Dir, "agent"), tc.data, 0o755); err != nil {
				t.Fatal(err)
			}
			spec := testSpec(plats)
			spec.Files = []string{"/agent"}
			_, err := Build(spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one that says %q", err, tc.want)
			}
		})
	}
	plats := platformDirs(t, testFiles, "", 0o755, time.Now())
	for name, change := range map[string]func(*Spec){
		"no tag":                  func(s *Spec) { s.Ref = "example.com/csi-volmgr/agent" },
		"entrypoint not a file":   func(s *Spec) { s.Entrypoint = []string{"/bin/sh"} },
		"relative file":           func(s *Spec) { s.Files = []string{"agent"}; s.Entrypoint = []string{"agent"} },
		"platform given twice":    func(s *Spec) { s.Platforms = append(s.Platforms, s.Platforms[0]) },
		"platform not built here": func(s *Spec) { s.Platforms[0].Architecture = "s390x" },
	} {
		spec := testSpec(slices.Clone(plats))
		change(&spec)
		if _, err := Build(spec); err == nil {
			t.Errorf("%s: built", name)
		}
	}
}

// TestDockerTar checks that the archive for docker load holds, for each
// layout, its image of the platform asked for, tagged with its name; and
// that a platform a layout lacks is an error.
func TestDockerTar(t *testing.T) {
	plats := platformDirs(t, testFiles, "", 0o755, time.Now())
	agentDir, _ := buildLayout(t, testSpec(plats))
	spec := testSpec(plats)
	spec.Ref = "example.com/csi-volmgr/runtime:v1.2.3"
	spec.Files, spec.Entrypoint = []string{"/agent"}, []string{"/agent"}
	runtimeDir, _ := buildLayout(t, spec)

	arm64 := v1.Platform{OS: "linux", Architecture: "arm64"}
	var buf bytes.Buffer
	if err := WriteDockerTar(&buf, arm64, []string{agentDir, runtimeDir}); err != nil {
		t.Fatal(err)
	}
	opener := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, d := range manifest {
		tags = append(tags, d.RepoTags...)
	}
	slices.Sort(tags)
	if want := []string{"example.com/csi-volmgr/agent:v1.2.3", "example.com/csi-volmgr/runtime:v1.2.3"}; !slices.Equal(tags, want) {
		t.Errorf("the archive tags %v, want %v", tags, want)
	}
	for _, dir := range []string{agentDir, runtimeDir} {
		idx, ref, err := ReadLayout(dir)
		if err != nil {
			t.Fatal(err)
		}
		want, err := platformImage(idx, arm64)
		if err != nil {
			t.Fatal(err)
		}
		tag, err := name.NewTag(ref.String())
		if err != nil {
			t.Fatal(err)
		}
		got, err := tarball.Image(opener, &tag)
		if err != nil {
			t.Fatal(err)
		}
		gotCfg, _ := got.RawConfigFile()
		wantCfg, _ := want.RawConfigFile()
		if !bytes.Equal(gotCfg, wantCfg) {
			t.Errorf("%s: the archive's config differs from the layout's arm64 image", ref)
		}
		gotLayers, _ := got.Layers()
		wantLayers, _ := want.Layers()
		if len(gotLayers) != 1 || len(wantLayers) != 1 {
			t.Fatalf("%s: %d layers in the archive, %d in the layout", ref, len(gotLayers), len(wantLayers))
		}
		gotDiff, _ := gotLayers[0].DiffID()
		wantDiff, _ := wantLayers[0].DiffID()
		if gotDiff != wantDiff {
			t.Errorf("%s: layer %s in the archive, %s in the layout", ref, gotDiff, wantDiff)
		}
	}
	err = WriteDockerTar(io.Discard, v1.Platform{OS: "linux", Architecture: "s390x"}, []string{agentDir})
	if err == nil || !strings.Contains(err.Error(), "no image for linux/s390x") {
		t.Errorf("a platform the layout lacks: %v", err)
	}
}
