//go:build drivers

package juicefs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nodePlugin is the JuiceFS node plugin as its DaemonSet's container runs it: the shell command
// (for `csi-volmgr check --driver-command` and for the lifecycle's process), its endpoint and
// the exact flags it runs with.
type nodePlugin struct {
	// Endpoint is the CSI socket's path.
	Endpoint string
	// Command runs the plugin in its "container": a mount and PID namespace of its own
	// (unshare), the juicefs client at the image's paths, the plugin as PID 1 of the namespace,
	// so that killing it (SIGKILL to its process group) kills every `juicefs mount` it started.
	Command string
	// Flags are the node plugin's command-line flags.
	Flags []string
	// Env is the environment it runs with besides the host's.
	Env []string
}

// newNodePlugin writes the container's start script into dir. shared is the directory the plugin
// mounts below (the agent's root, the check's scratch directory): it is made a shared mount here,
// so that mounts the plugin makes below it in its namespace reach the host's, as a Bidirectional
// hostPath does.
func newNodePlugin(t *testing.T, bins, dir, shared, endpoint, nodeID, webPort string) *nodePlugin {
	t.Helper()
	makeShared(t, shared)
	img := filepath.Join(dir, "image")
	for _, d := range []string{"usr-bin", "usr-local-bin", "var/lib/jfs", "var/lib/juicefs", "var/jfsCache"} {
		if err := os.MkdirAll(filepath.Join(img, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	client := filepath.Join(bins, "juicefs")
	// The image's paths (pkg/config: CeCliPath, CeMountPath), hard-coded in the driver.
	for _, l := range []string{filepath.Join(img, "usr-bin", "mount.juicefs"), filepath.Join(img, "usr-local-bin", "juicefs")} {
		if err := os.Symlink(client, l); err != nil {
			t.Fatal(err)
		}
	}
	p := &nodePlugin{
		Endpoint: endpoint,
		Flags: []string{
			"--endpoint=unix://" + endpoint,
			"--nodeid=" + nodeID,
			"--by-process=true",
			"--logtostderr",
			"--v=5",
		},
		// The DaemonSet's environment that matters in process mode: the plugin picks its role
		// (node or controller) from its pod's name; the metrics port is moved off 8080.
		Env: []string{"POD_NAME=juicefs-csi-node-" + nodeID, "NODE_NAME=" + nodeID, "JUICEFS_CSI_WEB_PORT=" + webPort},
	}
	// In the namespace: the root mount private first (so that nothing below reaches the host's
	// mounts, also on a host whose / is shared), the juicefs client over /usr/bin and
	// /usr/local/bin (read-only overlays: the host's files plus the image's), /var with the
	// driver's directories (MountBase /var/lib/jfs, where by-process mode mounts each volume;
	// JFSConfigPath; juicefs's default cache directory) on tmpfs, as the container's own
	// filesystem.
	script := strings.Join([]string{
		"#!/bin/sh",
		"# The JuiceFS node plugin's container (test/drivers/juicefs/container_test.go).",
		"set -eu",
		"mount --make-private /",
		fmt.Sprintf("mount -t overlay overlay -o lowerdir=%s:/usr/bin /usr/bin", filepath.Join(img, "usr-bin")),
		fmt.Sprintf("mount -t overlay overlay -o lowerdir=%s:/usr/local/bin /usr/local/bin", filepath.Join(img, "usr-local-bin")),
		fmt.Sprintf("mount -t overlay overlay -o lowerdir=%s:/var /var", filepath.Join(img, "var")),
		"for d in /var/lib/jfs /var/lib/juicefs /var/jfsCache; do mount -t tmpfs tmpfs $d; done",
		fmt.Sprintf("exec env %s %s %s", strings.Join(p.Env, " "), filepath.Join(bins, "juicefs-csi-driver"), strings.Join(p.Flags, " ")),
		"",
	}, "\n")
	path := filepath.Join(dir, "node-plugin.sh")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// Its output is appended to node-plugin.log in dir, across restarts.
	p.Command = "exec unshare --mount --pid --fork --kill-child=SIGKILL --propagation unchanged " + path +
		" >>" + filepath.Join(dir, "node-plugin.log") + " 2>&1"
	return p
}

// makeShared bind-mounts dir on itself as a shared mount. It is unmounted when t ends (with what
// is left below it: the test has checked by then that nothing is), unless dir is unmounted before.
func makeShared(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--bind", dir, dir}, {"--make-shared", dir}} {
		if out, err := runCmd("mount", args...); err != nil {
			t.Fatalf("mount %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		if mounted, _ := isMountPoint(dir); !mounted {
			return
		}
		if out, err := runCmd("umount", "--recursive", "--lazy", dir); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}
