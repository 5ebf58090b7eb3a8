// Command imagebuild builds the project's container images without Docker
// or a registry, with go-containerregistry: static binaries on an empty
// base, one OCI image layout per image holding a linux/amd64 and
// linux/arm64 index, the same digests for the same binaries. `make images`
// runs it; see deploy/kind/image/README.md.
//
//	imagebuild build -o DIR -ref REF -created TIME -entrypoint PATH [-user U] [-annotation K=V]... -platform OS/ARCH=DIR... FILE...
//	imagebuild docker-tar -platform OS/ARCH LAYOUT... > images.tar   (for docker load)
//	imagebuild image-tag -kustomization FILE -image NAME [-set TAG]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

// listFlag gathers a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: imagebuild build|docker-tar|image-tag [flags]")
	}
	switch args[0] {
	case "build":
		return runBuild(args[1:])
	case "docker-tar":
		return runDockerTar(args[1:])
	case "image-tag":
		return runImageTag(args[1:])
	}
	return fmt.Errorf("unknown command %q: want build, docker-tar or image-tag", args[0])
}

func runBuild(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	out := fs.String("o", "", "The OCI image layout to write (replaced).")
	ref := fs.String("ref", "", "The image's name and tag, e.g. ghcr.io/csi-volmgr/csi-volmgr:v0.1.0.")
	created := fs.String("created", "", "The image's time and its files' (RFC 3339), e.g. the commit's.")
	entrypoint := fs.String("entrypoint", "", "The program the image runs (one of FILE).")
	user := fs.String("user", "", "The image's user, e.g. 0:0.")
	var platforms, annotations listFlag
	fs.Var(&platforms, "platform", "OS/ARCH=DIR: build for OS/ARCH with the files under DIR (repeated).")
	fs.Var(&annotations, "annotation", "KEY=VALUE on the image index (repeated).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *ref == "" || *created == "" || *entrypoint == "" {
		return fmt.Errorf("build needs -o, -ref, -created and -entrypoint")
	}
	t, err := time.Parse(time.RFC3339, *created)
	if err != nil {
		return fmt.Errorf("-created: %w", err)
	}
	spec := Spec{Ref: *ref, Created: t, Files: fs.Args(), Entrypoint: []string{*entrypoint}, User: *user}
	for _, p := range platforms {
		plat, err := ParsePlatform(p)
		if err != nil {
			return err
		}
		spec.Platforms = append(spec.Platforms, plat)
	}
	for _, a := range annotations {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return fmt.Errorf("-annotation %q: want KEY=VALUE", a)
		}
		if spec.Annotations == nil {
			spec.Annotations = map[string]string{}
		}
		spec.Annotations[k] = v
	}
	idx, err := Build(spec)
	if err != nil {
		return fmt.Errorf("%s: %w", *ref, err)
	}
	if err := WriteLayout(*out, *ref, idx); err != nil {
		return fmt.Errorf("%s: %w", *out, err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s@%s\n", *out, *ref, digest)
	return nil
}

func runDockerTar(args []string) error {
	fs := flag.NewFlagSet("docker-tar", flag.ContinueOnError)
	platform := fs.String("platform", "", "OS/ARCH: the image of each layout to write, e.g. linux/amd64.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	p, err := v1.ParsePlatform(*platform)
	if err != nil || *platform == "" {
		return fmt.Errorf("-platform %q: want OS/ARCH", *platform)
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("docker-tar needs at least one image layout")
	}
	w := bufio.NewWriter(os.Stdout)
	if err := WriteDockerTar(w, *p, fs.Args()); err != nil {
		return err
	}
	return w.Flush()
}

func runImageTag(args []string) error {
	fs := flag.NewFlagSet("image-tag", flag.ContinueOnError)
	file := fs.String("kustomization", "", "The kustomization.yaml whose images: entry to read or set.")
	image := fs.String("image", "", "The name of the images: entry.")
	set := fs.String("set", "", "The tag to set (else print the entry's tag).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file == "" || *image == "" || fs.NArg() > 0 {
		return fmt.Errorf("image-tag needs -kustomization and -image, and takes no argument (%q)", fs.Args())
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	if *set == "" {
		tag, err := imageTag(data, *image)
		if err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		fmt.Println(tag)
		return nil
	}
	out, err := setImageTag(data, *image, *set)
	if err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	if string(out) == string(data) {
		return nil
	}
	st, err := os.Stat(*file)
	if err != nil {
		return err
	}
	return os.WriteFile(*file, out, st.Mode().Perm())
}
