package driverresult_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/test/drivers/driverresult"
)

// TestCommitIgnoresTheResults: the results make drivers writes while it
// runs do not make the commit it tests dirty; any other change does.
func TestCommitIgnoresTheResults(t *testing.T) {
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write := func(rel, data string) {
		t.Helper()
		p := filepath.Join(repo, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("init", "-q")
	write("docs/drivers/results/x.json", "{}")
	write("README.md", "a")
	git("add", ".")
	git("commit", "-q", "-m", "first")
	t.Chdir(filepath.Join(repo, "docs"))

	write("docs/drivers/results/x.json", `{"changed":true}`)
	if c, err := driverresult.Commit(t.Context()); err != nil || strings.HasSuffix(c, "-dirty") {
		t.Errorf("with only a result changed: %q, %v; want a clean commit", c, err)
	}
	write("README.md", "b")
	if c, err := driverresult.Commit(t.Context()); err != nil || !strings.HasSuffix(c, "-dirty") {
		t.Errorf("with README.md changed: %q, %v; want -dirty", c, err)
	}
}
