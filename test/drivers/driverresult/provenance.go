package driverresult

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Commit names csi-volmgr's commit a run tests: git describe, with "-dirty"
// when a tracked file differs from it — other than what make drivers itself
// writes while it runs: the results in docs/drivers/results and the table
// rendered from them into docs/drivers.md.
func Commit(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "git", "describe", "--tags", "--always").Output()
	if err != nil {
		return "", fmt.Errorf("git describe: %w", err)
	}
	commit := strings.TrimSpace(string(out))
	changed, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no", "--",
		":/", ":(exclude,top)docs/drivers/results", ":(exclude,top)docs/drivers.md").Output()
	if err != nil {
		return "", fmt.Errorf("git status: %w", err)
	}
	if strings.TrimSpace(string(changed)) != "" {
		commit += "-dirty"
	}
	return commit, nil
}

// Machine names the machine a run ran on: cores, kernel, Go version.
func Machine() string {
	var u unix.Utsname
	kernel := "unknown kernel"
	if unix.Uname(&u) == nil {
		kernel = "Linux " + unix.ByteSliceToString(u.Release[:])
	}
	return fmt.Sprintf("%d cores, %s, %s", runtime.NumCPU(), kernel, runtime.Version())
}
