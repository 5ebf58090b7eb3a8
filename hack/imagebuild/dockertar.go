package main

import (
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteDockerTar writes to w the image of platform from each layout in
// dirs, as one archive that `docker load` reads, each image tagged with
// the reference its layout names. A layout without that platform is an
// error: the caller asked for it.
func WriteDockerTar(w io.Writer, platform v1.Platform, dirs []string) error {
	images := map[name.Reference]v1.Image{}
	for _, dir := range dirs {
		idx, tag, err := ReadLayout(dir)
		if err != nil {
			return err
		}
		img, err := platformImage(idx, platform)
		if err != nil {
			return fmt.Errorf("%s (%s): %w", dir, tag, err)
		}
		if _, dup := images[tag]; dup {
			return fmt.Errorf("%s: %s is named twice", dir, tag)
		}
		images[tag] = img
	}
	return tarball.MultiRefWrite(images, w)
}

// platformImage returns the image of idx for platform.
func platformImage(idx v1.ImageIndex, platform v1.Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var have []string
	for _, desc := range m.Manifests {
		if desc.Platform == nil {
			continue
		}
		if desc.Platform.Equals(platform) {
			return idx.Image(desc.Digest)
		}
		have = append(have, desc.Platform.String())
	}
	return nil, fmt.Errorf("no image for %s (the index has %v)", platform, have)
}
