package deploy_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app"
	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/reconciler"
)

// unitFile is a systemd unit file: section → key → values, in order (a key
// may be given more than once).
type unitFile map[string]map[string][]string

// parseUnit reads a unit file as systemd does for the subset the unit
// uses: [Section] headers, Key=Value lines, comments (# and ;) and empty
// lines; anything else is an error.
func parseUnit(tb testing.TB, data []byte) unitFile {
	tb.Helper()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		case strings.HasSuffix(line, `\`):
			tb.Fatalf("line %d: continuation lines are not used here", n)
		default:
			key, value, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				tb.Fatalf("line %d: %q is neither a section, a Key=Value in one nor a comment", n, line)
			}
			key = strings.TrimSpace(key)
			u[section][key] = append(u[section][key], strings.TrimSpace(value))
		}
	}
	return u
}

// one returns the single value of key in section.
func (u unitFile) one(tb testing.TB, section, key string) string {
	tb.Helper()
	values := u[section][key]
	if len(values) != 1 {
		tb.Errorf("[%s] %s: %d values %v, want one", section, key, len(values), values)
		return ""
	}
	return values[0]
}

const unitPath = "systemd/csi-volmgr.service"

// TestSystemdUnit checks deploy/systemd/csi-volmgr.service: a simple
// service restarted always, whose stop sends SIGTERM to the agent alone and
// waits longer than the agent's shutdown grace, in the host's mount
// namespace (no option that would hide the agent's mounts from the host);
// its ExecStart is `run --config FILE` with flags run has, and FILE's
// example (deploy/systemd/config.yaml) loads with the real loader.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	u := parseUnit(t, data)
	for key, want := range map[string]string{
		"Type": "simple", "Restart": "always", "KillMode": "process", "KillSignal": "SIGTERM",
	} {
		if got := u.one(t, "Service", key); got != want {
			t.Errorf("[Service] %s=%s, want %s", key, got, want)
		}
	}
	if got := u.one(t, "Install", "WantedBy"); got != "multi-user.target" {
		t.Errorf("[Install] WantedBy=%s, want multi-user.target", got)
	}
	stop, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec") + "s")
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v (this test reads plain seconds)", err)
	}
	if stop <= reconciler.DefaultShutdownGrace {
		t.Errorf("TimeoutStopSec=%v does not exceed the agent's shutdown grace %v: systemd would SIGKILL steps in flight", stop, reconciler.DefaultShutdownGrace)
	}
	// Each of these puts the service in a mount namespace of its own,
	// from which the agent's mounts would not reach the host.
	for _, hiding := range []string{
		"PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateMounts", "PrivateDevices", "ReadOnlyPaths",
		"ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths",
		"MountFlags", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups", "RootDirectory", "RootImage",
	} {
		if _, ok := u["Service"][hiding]; ok {
			t.Errorf("[Service] %s= gives the agent a private mount namespace: its mounts would not propagate to the host", hiding)
		}
	}

	// ExecStart: the installed binary, run, and flags run has.
	args := strings.Fields(u.one(t, "Service", "ExecStart"))
	if len(args) < 2 || args[0] != "/usr/local/bin/csi-volmgr" || args[1] != "run" {
		t.Fatalf("ExecStart=%v, want /usr/local/bin/csi-volmgr run ...", args)
	}
	opts := app.NewRunOptions()
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse(args[2:]); err != nil {
		t.Fatalf("ExecStart's flags %v: %v", args[2:], err)
	}
	if opts.ConfigFile != "/etc/csi-volmgr/config.yaml" {
		t.Errorf("ExecStart --config %q, want /etc/csi-volmgr/config.yaml", opts.ConfigFile)
	}
	if !strings.Contains(string(data), "install -D -m 0600 config.yaml "+opts.ConfigFile) {
		t.Errorf("the unit's install steps do not put the example config at %s", opts.ConfigFile)
	}

	// The example config, with the loader run uses.
	c, err := config.Load(filepath.Join("systemd", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.RegisterNode || c.NodePods <= 0 || len(c.NodeTaints) == 0 {
		t.Errorf("the example registers no Node that takes pods: registerNode %v, nodePods %d, nodeTaints %v", c.RegisterNode, c.NodePods, c.NodeTaints)
	}
	if !filepath.IsAbs(c.RootDir) || !filepath.IsAbs(c.Kubeconfig) {
		t.Errorf("rootDir %q and kubeconfig %q must be absolute paths", c.RootDir, c.Kubeconfig)
	}
	// The agent acts as its Node, bootstrapped with the kubeconfig that
	// bootstrap-token.sh writes for that Node, and keeps its certificate on
	// the host's disk.
	if !c.NodeIdentity {
		t.Error("nodeIdentity is off: the agent would act as the kubeconfig's user, whose rights root on the host would hold")
	}
	if !strings.Contains(string(data), "install -D -m 0600 bootstrap-kubeconfig "+c.Kubeconfig) {
		t.Errorf("the unit's install steps do not put the bootstrap kubeconfig at %s", c.Kubeconfig)
	}
	if c.CertDir != "" && !filepath.IsAbs(c.CertDir) {
		t.Errorf("certDir %q must be an absolute path", c.CertDir)
	}
	if !strings.HasPrefix(c.NodeName, approverNodeNamePrefix(t)) || !bootstrapNodeName.MatchString(c.NodeName) {
		t.Errorf("nodeName %q: the approver approves a bootstrap token's request only for a Node named %s... without dots", c.NodeName, approverNodeNamePrefix(t))
	}
}

// bootstrapNodeName is a Node name a bootstrap token's group can carry
// (system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]) and bootstrap-token.sh
// accepts.
var bootstrapNodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// approverNodeNamePrefix is deploy/base's approver's --node-name-prefix.
func approverNodeNamePrefix(tb testing.TB) string {
	tb.Helper()
	dep := convert[appsv1.Deployment](tb, find(tb, render(tb, "base"), "Deployment", agentNamespace, approverName))
	prefix, ok := flagValue(dep.Spec.Template.Spec.Containers[0].Args, "node-name-prefix")
	if !ok {
		tb.Fatal("the approver has no --node-name-prefix")
	}
	return prefix
}

// TestSystemdAnalyzeVerify runs `systemd-analyze verify` on the unit, with
// ExecStart's binary replaced by one that exists here (verify checks that
// it does). It is skipped, and says so, where systemd-analyze is missing.
func TestSystemdAnalyzeVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit was not verified by systemd (TestSystemdUnit still checks its keys)")
	}
	data, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "csi-volmgr.service")
	if err := os.WriteFile(unit, bytes.ReplaceAll(data, []byte("/usr/local/bin/csi-volmgr "), []byte(self+" ")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), analyze, "verify", "--man=no", unit).CombinedOutput()
	// verify also reports the host's own units that the unit names
	// (network-online.target's dependencies); only lines about ours count.
	var ours []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if strings.Contains(line, "csi-volmgr.service") {
			ours = append(ours, line)
		}
	}
	if len(ours) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, strings.Join(ours, "\n"))
	}
	t.Logf("systemd-analyze verify: exit %v\n%s", err, out)
}
