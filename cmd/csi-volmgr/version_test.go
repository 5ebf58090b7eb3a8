package main_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/version"
)

// TestBuildVersionFromTheMakefile: a binary built with the Makefile's
// -ldflags reports the repository's git version, commit and tree state and
// the commit's date, with its Go version and platform.
func TestBuildVersionFromTheMakefile(t *testing.T) {
	root := repoRoot(t)
	out := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), name, args...)
		cmd.Dir = root
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return strings.TrimSpace(string(b))
	}
	ldflags := out("make", "-s", "--no-print-directory", "print-ldflags")
	bin := filepath.Join(t.TempDir(), "csi-volmgr")
	out("go", "build", "-ldflags", ldflags, "-o", bin, "./cmd/csi-volmgr")

	var got version.Info
	if err := json.Unmarshal([]byte(out(bin, "version", "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	want := version.Info{
		GitVersion: out("git", "describe", "--tags", "--always", "--dirty"),
		GitCommit:  out("git", "rev-parse", "HEAD"),
		GoVersion:  runtime.Version(), Compiler: runtime.Compiler, Platform: runtime.GOOS + "/" + runtime.GOARCH,
	}
	want.GitTreeState = "clean"
	if out("git", "status", "--porcelain", "--untracked-files=no") != "" {
		want.GitTreeState = "dirty"
	}
	if got.GitVersion != want.GitVersion || got.GitCommit != want.GitCommit || got.GitTreeState != want.GitTreeState ||
		got.GoVersion != want.GoVersion || got.Platform != want.Platform || got.Compiler != want.Compiler {
		t.Errorf("version -o json = %+v, want %+v", got, want)
	}
	if !strings.HasPrefix(got.BuildDate, "20") || !strings.HasSuffix(got.BuildDate, "Z") {
		t.Errorf("build date %q, want the commit's date in ISO 8601 UTC", got.BuildDate)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	b, err := exec.CommandContext(t.Context(), "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("finding the repository: %v", err)
	}
	return strings.TrimSpace(string(b))
}
