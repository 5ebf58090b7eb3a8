package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// baseKustomization is the part of deploy/base/kustomization.yaml that
// names images.
type baseKustomization struct {
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
		Digest  string `json:"digest"`
	} `json:"images"`
}

// releaseVersion is a tag the Makefile's VERSION (git describe --tags) is
// for a release: a tagged commit of a clean tree.
var releaseVersion = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)

// checkReleaseTag fails unless tag names a release, and the release of the
// checked-out commit when that commit is tagged (headTag, else "").
func checkReleaseTag(tag, headTag string) error {
	if !releaseVersion.MatchString(tag) {
		return fmt.Errorf("newTag %q is not a release version vX.Y.Z: deploy/base names what a release publishes (make deploy-image-tag IMAGE_TAG=vX.Y.Z before tagging)", tag)
	}
	if headTag != "" && tag != headTag {
		return fmt.Errorf("newTag %q, but this commit is release %s: make deploy-image-tag IMAGE_TAG=%s", tag, headTag, headTag)
	}
	return nil
}

// TestImagesBaseEntry checks that deploy/base names the agent's image in
// one place, the images: entry of its kustomization that `make
// deploy-image-tag` keeps in step with the Makefile's version: the
// DaemonSet's own manifest names no registry and no tag, the rendered
// DaemonSet and approver Deployment run that entry's image, and the tag is
// the release of this commit.
func TestImagesBaseEntry(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k baseKustomization
	if err := yamlUnmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) != 1 {
		t.Fatalf("base/kustomization.yaml has %d images: entries, want 1 (the agent's)", len(k.Images))
	}
	entry := k.Images[0]
	if entry.Digest != "" || entry.NewName == "" || entry.NewTag == "" {
		t.Fatalf("the images: entry %+v: want newName and newTag, no digest", entry)
	}

	raw, err := os.ReadFile(filepath.Join("base", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yamlUnmarshal(raw, &ds); err != nil {
		t.Fatal(err)
	}
	if got := container(t, ds.Spec.Template.Spec, "csi-volmgr").Image; got != entry.Name || strings.ContainsAny(got, ":/@") {
		t.Errorf("base/daemonset.yaml names image %q: want the bare name %q, so that the images: entry alone gives registry and tag", got, entry.Name)
	}

	want := entry.NewName + ":" + entry.NewTag
	objs := render(t, "base")
	if _, c := agentDaemonSet(t, objs); c.Image != want {
		t.Errorf("base: the agent runs %s, want %s (base's images: entry)", c.Image, want)
	}
	// The approver runs the agent's image, named the same way.
	dep := convert[appsv1.Deployment](t, find(t, objs, "Deployment", agentNamespace, approverName))
	if got := dep.Spec.Template.Spec.Containers[0].Image; got != want {
		t.Errorf("base: the approver runs %s, want %s (base's images: entry)", got, want)
	}

	if err := checkReleaseTag(entry.NewTag, headReleaseTag(t)); err != nil {
		t.Error(err)
	}

	// What `make images` tags by default is what deploy/ names, so that a
	// clone's `kubectl apply -k deploy/base` runs the image it built.
	cmd := exec.CommandContext(t.Context(), "make", "-s", "--no-print-directory", "print-image-tag")
	cmd.Dir = repoRoot(t)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IMAGE_TAG=") { // the default, not a caller's override
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make print-image-tag: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != entry.NewTag {
		t.Errorf("make images tags %q by default, deploy/base names %q", got, entry.NewTag)
	}
}

// headReleaseTag returns the release tag (vX.Y.Z) of the checked-out
// commit, or "" when it has none or git cannot tell.
func headReleaseTag(t *testing.T) string {
	out, err := exec.CommandContext(t.Context(), "git", "-C", repoRoot(t), "tag", "--points-at", "HEAD").Output()
	if err != nil {
		t.Logf("git tag --points-at HEAD: %v; not comparing with the commit's release", err)
		return ""
	}
	for _, tag := range strings.Fields(string(out)) {
		if releaseVersion.MatchString(tag) {
			return tag
		}
	}
	return ""
}

// TestImagesReleaseTagCheck shows checkReleaseTag firing.
func TestImagesReleaseTagCheck(t *testing.T) {
	for _, tc := range []struct {
		tag, head string
		ok        bool
	}{
		{"v0.1.0", "", true},
		{"v0.2.0", "v0.2.0", true},
		{"v0.1.0", "v0.2.0", false},
		{"v0.1.0-3-gabcdef0", "", false},
		{"v0.1.0-dirty", "", false},
		{"3c6d004", "", false},
		{"kind", "", false},
	} {
		if err := checkReleaseTag(tc.tag, tc.head); (err == nil) != tc.ok {
			t.Errorf("tag %q at release %q: error %v, want ok=%v", tc.tag, tc.head, err, tc.ok)
		}
	}
}
