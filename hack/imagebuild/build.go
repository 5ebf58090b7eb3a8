package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The annotations of the index.json entry that names the image: the tag
// (OCI image layout) and the whole reference (containerd's import reads it,
// and docker-tar tags the image with it).
const (
	refNameAnnotation        = "org.opencontainers.image.ref.name"
	containerdNameAnnotation = "io.containerd.image.name"
)

// Spec is one multi-platform image: the same files, taken for each platform
// from that platform's directory, on an empty base.
type Spec struct {
	// Ref names the image, with its tag: ghcr.io/csi-volmgr/csi-volmgr:v0.1.0.
	Ref string
	// Created is the time of the image, its history and every file in it;
	// the commit's time makes two builds of one commit the same.
	Created time.Time
	// Files are the absolute paths in the image; each is read from the
	// platform's directory at the same path. Every one must be a static
	// executable for the platform: the base is empty.
	Files []string
	// Entrypoint runs the image; User is its user (0:0 for root).
	Entrypoint []string
	User       string
	// Annotations go on the index (org.opencontainers.image.version, ...).
	Annotations map[string]string
	Platforms   []Platform
}

// Platform is where one platform's files are.
type Platform struct {
	v1.Platform
	Dir string
}

// ParsePlatform reads os/arch=dir.
func ParsePlatform(s string) (Platform, error) {
	plat, dir, ok := strings.Cut(s, "=")
	if !ok || dir == "" {
		return Platform{}, fmt.Errorf("platform %q: want os/arch=directory", s)
	}
	p, err := v1.ParsePlatform(plat)
	if err != nil {
		return Platform{}, err
	}
	if p.OS == "" || p.Architecture == "" || p.Variant != "" {
		return Platform{}, fmt.Errorf("platform %q: want os/arch", plat)
	}
	return Platform{Platform: *p, Dir: dir}, nil
}

// elfMachines are the architectures an image may be built for, with the
// machine their executables declare.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// Build returns the image index of spec: one image per platform, each of
// one layer that holds the files, and a config with the entrypoint.
// Nothing of the host but the files' contents goes in: the layer's entries
// are sorted, owned by 0:0, dated Created and mode 0755, so that the same
// files give the same digests.
func Build(spec Spec) (v1.ImageIndex, error) {
	if _, err := tagOf(spec.Ref); err != nil {
		return nil, err
	}
	if len(spec.Files) == 0 || len(spec.Entrypoint) == 0 || len(spec.Platforms) == 0 {
		return nil, errors.New("an image needs files, an entrypoint and at least one platform")
	}
	if !slices.Contains(spec.Files, spec.Entrypoint[0]) {
		return nil, fmt.Errorf("the entrypoint %s is not one of the image's files %v", spec.Entrypoint[0], spec.Files)
	}
	created := v1.Time{Time: spec.Created.UTC()}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, p := range spec.Platforms {
		if seen[p.String()] {
			return nil, fmt.Errorf("platform %s given twice", p)
		}
		seen[p.String()] = true
		layer, err := filesLayer(p, spec.Files, created.Time)
		if err != nil {
			return nil, err
		}
		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		img, err = mutate.ConfigFile(img, &v1.ConfigFile{
			Architecture: p.Architecture,
			OS:           p.OS,
			Created:      created,
			Config:       v1.Config{Entrypoint: spec.Entrypoint, User: spec.User},
			RootFS:       v1.RootFS{Type: "layers"},
		})
		if err != nil {
			return nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History: v1.History{
				Created:   created,
				CreatedBy: "hack/imagebuild: " + strings.Join(spec.Files, " "),
				Comment:   "static binaries on an empty base",
			},
		})
		if err != nil {
			return nil, err
		}
		plat := p.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &plat},
		})
	}
	if len(spec.Annotations) > 0 {
		idx = mutate.Annotations(idx, spec.Annotations).(v1.ImageIndex)
	}
	return idx, nil
}

// filesLayer is the layer of one platform: its directory's files at their
// paths in the image, and the directories above them.
func filesLayer(p Platform, files []string, mtime time.Time) (v1.Layer, error) {
	machine, ok := elfMachines[p.Architecture]
	if !ok || p.OS != "linux" {
		return nil, fmt.Errorf("platform %s: only linux/amd64 and linux/arm64 are built", p)
	}
	type entry struct {
		hdr  *tar.Header
		data []byte
	}
	entries := map[string]entry{}
	for _, f := range files {
		clean := path.Clean(f)
		if !path.IsAbs(f) || clean != f || f == "/" {
			return nil, fmt.Errorf("file %q: want a clean absolute path in the image", f)
		}
		src := filepath.Join(p.Dir, filepath.FromSlash(f))
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if err := checkStaticELF(data, machine); err != nil {
			return nil, fmt.Errorf("%s for %s: %w", src, p, err)
		}
		rel := strings.TrimPrefix(f, "/")
		if _, dup := entries[rel]; dup {
			return nil, fmt.Errorf("file %s given twice", f)
		}
		entries[rel] = entry{hdr: header(rel, tar.TypeReg, int64(len(data)), mtime), data: data}
		for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
			entries[dir+"/"] = entry{hdr: header(dir+"/", tar.TypeDir, 0, mtime)}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		if err := tw.WriteHeader(e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// header is a tar header that says nothing of the host: root's, dated
// mtime, executable by all.
func header(name string, typ byte, size int64, mtime time.Time) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Size:     size,
		Mode:     0o755,
		ModTime:  mtime,
		Format:   tar.FormatPAX,
	}
}

// checkStaticELF fails unless data is an executable for machine that needs
// no dynamic loader: the base has none.
func checkStaticELF(data []byte, machine elf.Machine) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer func() { _ = f.Close() }()
	if f.Machine != machine {
		return fmt.Errorf("built for %s, want %s", f.Machine, machine)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %s is not an executable", f.Type)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (it names a program interpreter): build it with CGO_ENABLED=0")
		}
	}
	return nil
}

// tagOf returns the tag of ref, which must have one.
func tagOf(ref string) (name.Tag, error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image %q: want registry/repository:tag: %w", ref, err)
	}
	return tag, nil
}

// WriteLayout writes idx as the one image of a new OCI image layout at dir,
// named ref (the tag as org.opencontainers.image.ref.name, the whole
// reference as io.containerd.image.name). What dir held is replaced only
// once the new layout is complete.
func WriteLayout(dir, ref string, idx v1.ImageIndex) error {
	tag, err := tagOf(ref)
	if err != nil {
		return err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		refNameAnnotation:        tag.TagStr(),
		containerdNameAnnotation: tag.Name(),
	})); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// ReadLayout returns the image index of the one image of the layout at dir
// and the reference it is named by.
func ReadLayout(dir string) (v1.ImageIndex, name.Tag, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, name.Tag{}, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, name.Tag{}, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, name.Tag{}, err
	}
	if len(m.Manifests) != 1 || m.Manifests[0].MediaType != types.OCIImageIndex {
		return nil, name.Tag{}, fmt.Errorf("%s: want one image index in index.json, found %d entries", dir, len(m.Manifests))
	}
	desc := m.Manifests[0]
	tag, err := tagOf(desc.Annotations[containerdNameAnnotation])
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("%s: %w", dir, err)
	}
	if tag.TagStr() != desc.Annotations[refNameAnnotation] {
		return nil, name.Tag{}, fmt.Errorf("%s: %s is %q, %s %q", dir, refNameAnnotation, desc.Annotations[refNameAnnotation], containerdNameAnnotation, tag)
	}
	idx, err := top.ImageIndex(desc.Digest)
	if err != nil {
		return nil, name.Tag{}, err
	}
	return idx, tag, nil
}
