package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRunCommands runs the commands as make does: build a layout, write
// the docker archive, set a kustomization's tag; and refuses stray
// arguments.
func TestRunCommands(t *testing.T) {
	plats := platformDirs(t, []string{"/agent"}, "", 0o755, time.Now())
	out := filepath.Join(t.TempDir(), "agent")
	args := []string{"build", "-o", out, "-ref", testRef, "-created", "2026-11-27T00:18:57Z", "-user", "0:0",
		"-entrypoint", "/agent", "-annotation", "org.opencontainers.image.version=v1.2.3"}
	for _, p := range plats {
		args = append(args, "-platform", p.String()+"="+p.Dir)
	}
	if err := run(append(args, "/agent")); err != nil {
		t.Fatal(err)
	}
	if _, tag, err := ReadLayout(out); err != nil || tag.String() != testRef {
		t.Fatalf("layout %s: %s, %v", out, tag, err)
	}
	file := filepath.Join(t.TempDir(), "kustomization.yaml")
	if err := os.WriteFile(file, []byte(twoImages), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"image-tag", "-kustomization", file, "-image", "other", "-set", "v2.0.0"}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(file)
	if tag, err := imageTag(data, "other"); err != nil || tag != "v2.0.0" {
		t.Errorf("tag %q, %v", tag, err)
	}
	for _, bad := range [][]string{
		{"image-tag", "-kustomization", file, "-image", "other", "-set", "v3", "stray"},
		{"build", "-o", out, "-ref", testRef, "-created", "yesterday", "-entrypoint", "/agent", "/agent"},
		{"docker-tar", "-platform", "linux/amd64"},
		{"push"},
	} {
		if err := run(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
