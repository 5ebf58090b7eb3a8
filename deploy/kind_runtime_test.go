package deploy_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/csi-volmgr/csi-volmgr/test/gobuild"
)

var exampleRuntime = &gobuild.Binary{
	Package:     "github.com/csi-volmgr/csi-volmgr/examples/vk-runtime",
	Name:        "csi-volmgr-example-runtime",
	EnvOverride: "CSI_VOLMGR_EXAMPLE_RUNTIME",
}

// runtimeFlags returns the flags the example runtime accepts, from its
// -h output.
func runtimeFlags(t *testing.T) []string {
	t.Helper()
	bin, err := exampleRuntime.Path()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(t.Context(), bin, "-h")
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // -h exits 0 or 2 depending on the flag package; the text is what counts
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9_-]+)`).FindAllStringSubmatch(out.String(), -1) {
		flags = append(flags, m[1])
	}
	if !slices.Contains(flags, "node-name") {
		t.Fatalf("cannot read the example runtime's flags from its -h output:\n%s", out.String())
	}
	return flags
}

// TestKindRuntimePairing checks deploy/kind/runtime without running kind:
// the example runtime takes the agent's place in deploy/kind's DaemonSet
// (same host, same root and registration directories, same virtual
// node), every argument is a flag it has, the embedded csi-volmgr acts as
// its Node with its certificate on the host as the agent's, its Node carries
// the taint the example pods tolerate, its kubelet endpoint is the pod's IP
// and a container port, the system directories it gives containers come
// from the node's root mounted read-only without Bidirectional propagation,
// and its ServiceAccount has what virtual-kubelet's controllers do, and
// none of the embedded csi-volmgr's rights that its Node has.
func TestKindRuntimePairing(t *testing.T) {
	kindObjs, objs := render(t, "kind"), render(t, filepath.Join("kind", "runtime"))
	kindDS, kindAgent := agentDaemonSet(t, kindObjs)
	ds, rt := agentDaemonSet(t, objs)
	spec := ds.Spec.Template.Spec

	if rt.Image != "csi-volmgr-example-runtime:kind" || rt.ImagePullPolicy != corev1.PullNever {
		t.Errorf("image %s (pull %s), want csi-volmgr-example-runtime:kind, never pulled (make images, then up.sh tags it)", rt.Image, rt.ImagePullPolicy)
	}
	if !equality.Semantic.DeepEqual(spec.NodeSelector, kindDS.Spec.Template.Spec.NodeSelector) {
		t.Errorf("nodeSelector %v, want deploy/kind's %v: the runtime embeds the agent on its host", spec.NodeSelector, kindDS.Spec.Template.Spec.NodeSelector)
	}
	known := runtimeFlags(t)
	for _, a := range rt.Args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !slices.Contains(known, name) {
			t.Errorf("argument %q is not a flag of the example runtime (it has %v)", a, known)
		}
	}
	for _, f := range []string{"node-name", "root-dir", "registration-dir", "http-endpoint"} {
		got, _ := flagValue(rt.Args, f)
		want, _ := flagValue(kindAgent.Args, f)
		if got != want {
			t.Errorf("--%s=%q, want deploy/kind's %q", f, got, want)
		}
	}
	for _, dir := range []string{"root-dir", "registration-dir"} {
		path, _ := flagValue(rt.Args, dir)
		got, gotMount := hostPathMount(t, spec, rt, path)
		want, wantMount := hostPathMount(t, kindDS.Spec.Template.Spec, kindAgent, path)
		if got.Path != want.Path || !equality.Semantic.DeepEqual(gotMount.MountPropagation, wantMount.MountPropagation) {
			t.Errorf("--%s: host path %s (%v), want deploy/kind's %s (%v)", dir, got.Path, gotMount.MountPropagation, want.Path, wantMount.MountPropagation)
		}
	}

	// The embedded csi-volmgr's Node certificate: on the host, where the
	// agent keeps its own (<root-dir>/pki), so that a restarted pod reuses it.
	root, _ := flagValue(rt.Args, "root-dir")
	if certDir, ok := flagValue(rt.Args, "node-cert-dir"); !ok || filepath.Clean(certDir) != filepath.Join(root, "pki") {
		t.Errorf("--node-cert-dir=%q: want %s, the agent's certificate directory on the host (the embedded csi-volmgr then acts as its Node)", certDir, filepath.Join(root, "pki"))
	}

	value, _ := flagValue(rt.Args, "taint")
	taint, err := parseTaint(value)
	if want := virtualNodeTaint(t); err != nil || !taint.MatchTaint(&want) || taint.Value != want.Value {
		t.Errorf("--taint=%q (%v), want VIRTUAL_NODE_TAINT of kind/lib.sh, %s, which the example pods tolerate", value, err, want.ToString())
	}

	// The kubelet endpoint: the pod's IP, at a port the pod declares.
	if ip, _ := flagValue(rt.Args, "internal-ip"); ip != "$(POD_IP)" || !slices.ContainsFunc(rt.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
	}) {
		t.Errorf("--internal-ip=%q, env %v: want $(POD_IP) from status.podIP", ip, rt.Env)
	}
	port, _ := flagValue(rt.Args, "kubelet-port")
	if port == "" || !slices.ContainsFunc(rt.Ports, func(p corev1.ContainerPort) bool { return probePort(rt, p.Name) == port }) {
		t.Errorf("--kubelet-port=%q is not a container port (%v)", port, rt.Ports)
	}

	// The containers' system directories: the node's root, read-only; an
	// unmount on the host reaches the copy (HostToContainer), and nothing
	// propagates back to the host.
	hostRoot, _ := flagValue(rt.Args, "host-root")
	hp, m := hostPathMount(t, spec, rt, hostRoot)
	if filepath.Clean(hp.Path) != "/" || !m.ReadOnly || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
		t.Errorf("--host-root=%s is host path %s (readOnly %v, propagation %v): want / read-only with HostToContainer", hostRoot, hp.Path, m.ReadOnly, m.MountPropagation)
	}

	// What virtual-kubelet's node and pod controllers do beyond the agent.
	granted := accesses(agentGrants(t, nil, objs, ds.Namespace, spec.ServiceAccountName))
	for _, a := range []access{
		{Verb: "create", Resource: "nodes"}, {Verb: "patch", Resource: "nodes/status"},
		{Verb: "create", Group: "coordination.k8s.io", Resource: "leases"}, {Verb: "update", Group: "coordination.k8s.io", Resource: "leases"},
		{Verb: "update", Resource: "pods/status"}, {Verb: "delete", Resource: "pods"},
		{Verb: "watch", Resource: "configmaps"}, {Verb: "watch", Resource: "secrets"}, {Verb: "watch", Resource: "services"},
	} {
		if !slices.Contains(granted, a) {
			t.Errorf("the runtime's ServiceAccount cannot %s", a)
		}
	}
	// What the embedded csi-volmgr does as its Node: never the
	// ServiceAccount's.
	for _, a := range []access{
		{Verb: "create", Resource: "serviceaccounts/token"}, {Verb: "get", Resource: "secrets"},
		{Verb: "get", Resource: "persistentvolumes"}, {Verb: "patch", Resource: "persistentvolumeclaims/status"},
		{Verb: "delete", Group: "storage.k8s.io", Resource: "csinodes"}, {Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"},
	} {
		if slices.Contains(granted, a) {
			t.Errorf("the runtime's ServiceAccount may %s: the embedded csi-volmgr does that as its Node", a)
		}
	}
}
