package gobuild

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// Binary is one main package to build at most once per test binary.
type Binary struct {
	// Package is the import path of the main package.
	Package string
	// Name is the file name of the binary (with "-race" appended under -race).
	Name string
	// EnvOverride names an environment variable that points at a prebuilt
	// binary; when it is set, Path returns it and builds nothing.
	EnvOverride string

	once sync.Once
	path string
	err  error
}

// Path returns the path of the binary. The first call runs "go build" (with
// -race when the test binary has it); later calls return the same path. It
// must run inside the module, as "go test" does.
func (b *Binary) Path() (string, error) {
	if p := os.Getenv(b.EnvOverride); b.EnvOverride != "" && p != "" {
		return p, nil
	}
	b.once.Do(func() { b.path, b.err = b.build() })
	return b.path, b.err
}

func (b *Binary) build() (string, error) {
	// go test puts $GOROOT/bin first in the test binary's PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go tool (or set %s to a prebuilt binary): %w", b.EnvOverride, err)
	}
	// One directory per package directory, so that test binaries of other checkouts (worktrees) of
	// the repository, which may build a different version at the same moment, never swap the
	// binary under this one.
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the working directory: %w", err)
	}
	sum := sha256.Sum256([]byte(wd))
	dir := filepath.Join(os.TempDir(), "csi-volmgr-"+b.Name, hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create build directory: %w", err)
	}
	name := b.Name
	args := []string{"build"}
	if raceEnabled {
		name += "-race"
		args = append(args, "-race")
	}
	// Build under a unique name and rename, so concurrently running test binaries never see a partial file.
	tmp, err := os.CreateTemp(dir, name+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("create build output: %w", err)
	}
	_ = tmp.Close()
	defer func() { _ = os.Remove(tmp.Name()) }()

	cmd := exec.Command(goTool, append(args, "-o", tmp.Name(), b.Package)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", b.Package, err, out)
	}
	final := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", fmt.Errorf("install %s: %w", b.Name, err)
	}
	return final, nil
}
