package agenttest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// EnvBinary names an environment variable that points at a prebuilt csi-volmgr binary.
// When it is set, Binary returns it and builds nothing.
const EnvBinary = "CSI_VOLMGR_BINARY"

// agentPackage is the import path of the agent's main package.
const agentPackage = "github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr"

var build struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of the csi-volmgr binary. The first call in a test binary runs
// "go build" (with -race when the test binary has it) into a fixed directory under os.TempDir and
// atomically replaces the binary there; later calls return the same path. It must run inside the
// module, as "go test" does.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		return p, nil
	}
	build.once.Do(func() { build.path, build.err = buildBinary() })
	return build.path, build.err
}

func buildBinary() (string, error) {
	// go test puts $GOROOT/bin first in the test binary's PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go tool (or set %s to a prebuilt binary): %w", EnvBinary, err)
	}
	dir := filepath.Join(os.TempDir(), "csi-volmgr-agent")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create build directory: %w", err)
	}
	name := "csi-volmgr"
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

	cmd := exec.Command(goTool, append(args, "-o", tmp.Name(), agentPackage)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", agentPackage, err, out)
	}
	final := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", fmt.Errorf("install agent binary: %w", err)
	}
	return final, nil
}
