package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const twoImages = `# A comment that stays.
resources:
  - daemonset.yaml

images:
  # The agent.
  - name: csi-volmgr
    newName: ghcr.io/csi-volmgr/csi-volmgr
    newTag: v0.1.0 # a comment that stays too
  - name: other
    newTag: v0.1.0
`

// TestSetImageTag checks that the tag of one images: entry is rewritten and
// nothing else, that a tag YAML would read as a number is quoted, and that
// what is not a tag or not there is refused.
func TestSetImageTag(t *testing.T) {
	out, err := setImageTag([]byte(twoImages), "csi-volmgr", "v0.2.0-3-gabcdef0")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(twoImages, "newTag: v0.1.0 #", "newTag: v0.2.0-3-gabcdef0 #", 1)
	if string(out) != want {
		t.Errorf("rewrote to\n%s\nwant\n%s", out, want)
	}
	out, err = setImageTag([]byte(twoImages), "other", "1234567")
	if err != nil {
		t.Fatal(err)
	}
	if tag, err := imageTag(out, "other"); err != nil || tag != "1234567" || !strings.Contains(string(out), `newTag: "1234567"`) {
		t.Errorf("a numeric commit as tag: %q, %v in\n%s", tag, err, out)
	}
	if tag, _ := imageTag(out, "csi-volmgr"); tag != "v0.1.0" {
		t.Errorf("the other entry changed to %q", tag)
	}
	for _, tc := range []struct{ image, tag string }{
		{"csi-volmgr", "v1 ; rm"},
		{"csi-volmgr", ""},
		{"missing", "v0.2.0"},
	} {
		if _, err := setImageTag([]byte(twoImages), tc.image, tc.tag); err == nil {
			t.Errorf("set %s to %q: no error", tc.image, tc.tag)
		}
	}
	if _, err := setImageTag([]byte("images:\n  - name: csi-volmgr\n    newName: x\n"), "csi-volmgr", "v1"); err == nil {
		t.Error("an entry without newTag: no error")
	}
}

// TestSetImageTagOfBase rewrites deploy/base's kustomization, the file
// `make deploy-image-tag` keeps in step.
func TestSetImageTagOfBase(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := setImageTag(data, "csi-volmgr", "v9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	if tag, err := imageTag(out, "csi-volmgr"); err != nil || tag != "v9.9.9" {
		t.Errorf("tag %q, %v", tag, err)
	}
	if strings.Count(string(out), "\n") != strings.Count(string(data), "\n") {
		t.Error("the rewrite changed the number of lines")
	}
}
