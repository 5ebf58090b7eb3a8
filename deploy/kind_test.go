package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/nodeowner"
)

// kindCluster is the part of kind's v1alpha4 Cluster config the test reads.
type kindCluster struct {
	Nodes []struct {
		Role   string            `json:"role"`
		Labels map[string]string `json:"labels"`
	} `json:"nodes"`
}

// The kubelet's directories on a kind node.
const (
	kubeletRegistrationDir = "/var/lib/kubelet/plugins_registry"
	kubeletRootDir         = "/var/lib/kubelet"
)

// TestKindPairing checks that the pieces of deploy/kind fit together without
// running kind (make kind-e2e does that): the agent serves the virtual node;
// the CSI test plugin runs on the agent's host, registers where both the
// agent and that host's kubelet look, and mounts where each of them
// publishes; its sidecars reach its socket; the example pods land on the
// virtual node and on the agent's host with claims of the plugin's
// StorageClass.
func TestKindPairing(t *testing.T) {
	objs := render(t, "kind")
	ds, agent := agentDaemonSet(t, objs)

	if got, _ := flagValue(agent.Args, "node-name"); strings.ReplaceAll(got, "$(NODE_NAME)", kindAgentHost) != kindVirtualNode || !envFromNodeName(agent, "NODE_NAME") {
		t.Errorf("--node-name=%q on %s, want %q ($(NODE_NAME) the host's name, from spec.nodeName)", got, kindAgentHost, kindVirtualNode)
	}
	if lib := kindLib(t); lib["AGENT_HOST"] != "$CLUSTER-worker" || lib["CLUSTER"] != "${KIND_CLUSTER:-csi-volmgr}" || lib["VIRTUAL_NODE"] != "csi-volmgr-$AGENT_HOST" {
		t.Errorf("kind/lib.sh: AGENT_HOST=%s, CLUSTER=%s, VIRTUAL_NODE=%s: want the worker of cluster csi-volmgr and csi-volmgr-$AGENT_HOST, the agent's --node-name there",
			lib["AGENT_HOST"], lib["CLUSTER"], lib["VIRTUAL_NODE"])
	}
	if v, ok := flagValue(agent.Args, "register-node"); !ok || v != "true" {
		t.Error("the agent of a node without kubelet needs --register-node")
	}
	// The agent registers the virtual node ready to take pods, with no
	// patch by hand (kind/up.sh): a pod capacity for the scheduler, and the
	// taint the example pods tolerate.
	run := pflag.NewFlagSet("run", pflag.ContinueOnError)
	opts := app.NewRunOptions()
	opts.AddFlags(run)
	if err := run.Parse(agent.Args[1:]); err != nil {
		t.Errorf("the agent's arguments %v: %v", agent.Args, err)
	}
	if want := virtualNodeTaint(t); !slices.ContainsFunc(opts.NodeTaints, func(got corev1.Taint) bool { return got.MatchTaint(&want) && got.Value == want.Value }) {
		t.Errorf("--node-taints %v lacks VIRTUAL_NODE_TAINT of kind/lib.sh, %s, which the example pods tolerate", opts.NodeTaints, want.ToString())
	}
	if opts.NodePods <= 0 {
		t.Errorf("--node-pods=%d: the scheduler places no pod on the virtual node", opts.NodePods)
	}
	up, err := os.ReadFile(filepath.Join("kind", "up.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, byHand := range []string{"taint node", "patch node"} {
		if strings.Contains(string(up), byHand) {
			t.Errorf("kind/up.sh has %q: the agent's flags shape the virtual node", byHand)
		}
	}

	root, _ := flagValue(agent.Args, "root-dir")
	rootHost, _ := hostPathMount(t, ds.Spec.Template.Spec, agent, root)
	reg, _ := flagValue(agent.Args, "registration-dir")
	regHost, _ := hostPathMount(t, ds.Spec.Template.Spec, agent, reg)
	if filepath.Clean(regHost.Path) != kubeletRegistrationDir {
		t.Errorf("the agent watches host path %s for registrations, want the kubelet's %s: the host's drivers serve both", regHost.Path, kubeletRegistrationDir)
	}

	// The host the agent runs on is a kind worker with the agent's label.
	data, err := os.ReadFile(filepath.Join("kind", "cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cluster kindCluster
	if err := yamlUnmarshal(data, &cluster); err != nil {
		t.Fatalf("kind/cluster.yaml: %v", err)
	}
	hosts := 0
	for _, n := range cluster.Nodes {
		if matches(ds.Spec.Template.Spec.NodeSelector, n.Labels) {
			hosts++
		}
	}
	if hosts != 1 {
		t.Errorf("%d kind nodes match the agent's nodeSelector %v; exactly one agent may serve %s", hosts, ds.Spec.Template.Spec.NodeSelector, kindVirtualNode)
	}

	// The driver.
	sts := convert[appsv1.StatefulSet](t, find(t, objs, "StatefulSet", agentNamespace, "csi-testplugin"))
	spec := sts.Spec.Template.Spec
	if !matches(ds.Spec.Template.Spec.NodeSelector, spec.NodeSelector) || len(spec.NodeSelector) == 0 {
		t.Errorf("the driver's nodeSelector %v does not put it on the agent's host (%v)", spec.NodeSelector, ds.Spec.Template.Spec.NodeSelector)
	}
	plugin := container(t, spec, "testplugin")
	driverName, _ := flagValue(plugin.Args, "name")
	if nodeID, _ := flagValue(plugin.Args, "node-id"); nodeID != "$(NODE_NAME)" || !envFromNodeName(plugin, "NODE_NAME") {
		t.Errorf("--node-id=%q: want the host's node name, $(NODE_NAME) from spec.nodeName, the storage node of both the kubelet and the agent", nodeID)
	}
	pluginReg, _ := flagValue(plugin.Args, "registration-dir")
	if host, _ := hostPathFor(t, spec, plugin, pluginReg); host != filepath.Clean(regHost.Path) {
		t.Errorf("the plugin registers into host path %s, the agent watches %s", host, regHost.Path)
	}
	// The kubelet and the agent dial the endpoint the plugin reports: it
	// must be the same path on the host and in the agent's container.
	endpoint, _ := flagValue(plugin.Args, "endpoint")
	if host, _ := hostPathFor(t, spec, plugin, endpoint); host != filepath.Clean(endpoint) {
		t.Errorf("the plugin's endpoint %s is host path %s: the kubelet and the agent could not dial it", endpoint, host)
	}
	if !below(endpoint, rootHost.Path) {
		t.Errorf("--endpoint=%s is not below the agent's root %s: the agent cannot dial it", endpoint, rootHost.Path)
	}
	for _, root := range []struct{ inPlugin, host string }{{root, rootHost.Path}, {kubeletRootDir, kubeletRootDir}} {
		for _, sub := range []string{"pods", "plugins"} {
			path := filepath.Join(root.inPlugin, sub)
			host, m := hostPathFor(t, spec, plugin, path)
			if host != filepath.Join(root.host, sub) {
				t.Errorf("the driver sees host path %s at %s, want %s", host, path, filepath.Join(root.host, sub))
			}
			if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
				t.Errorf("the driver's mount %s must be Bidirectional so that its mounts reach the host", m.MountPath)
			}
		}
	}
	if v, _ := flagValue(plugin.Args, "controller-publish-unpublish"); v != "true" {
		t.Error("the plugin needs --controller-publish-unpublish to pair with csi-attacher")
	}
	for _, name := range []string{"csi-attacher", "csi-provisioner"} {
		sidecar := container(t, spec, name)
		addr, _ := flagValue(sidecar.Args, "csi-address")
		if host, _ := hostPathFor(t, spec, sidecar, addr); host != filepath.Clean(endpoint) {
			t.Errorf("%s --csi-address=%s is host path %s, the plugin serves %s", name, addr, host, endpoint)
		}
	}

	// The CSIDriver, for the attach/detach controller.
	drv := convert[storagev1.CSIDriver](t, find(t, objs, "CSIDriver", "", driverName))
	if drv.Spec.AttachRequired == nil || !*drv.Spec.AttachRequired {
		t.Errorf("CSIDriver %s: want attachRequired, so that the VolumeAttachment path is exercised", driverName)
	}

	// The example workloads: one StorageClass, a pod on the virtual node and
	// one on the agent's host, each with its claim.
	example := render(t, filepath.Join("kind", "example"))
	sc := ofKind[storagev1.StorageClass](t, example, "StorageClass")
	pvcs := ofKind[corev1.PersistentVolumeClaim](t, example, "PersistentVolumeClaim")
	pods := ofKind[corev1.Pod](t, example, "Pod")
	if len(sc) != 1 || len(pvcs) != 2 || len(pods) != 2 {
		t.Fatalf("example: want one StorageClass, two PVCs and two Pods, got %d, %d, %d", len(sc), len(pvcs), len(pods))
	}
	if sc[0].Provisioner != driverName {
		t.Errorf("StorageClass provisioner %q, want %q", sc[0].Provisioner, driverName)
	}
	if sc[0].VolumeBindingMode == nil || *sc[0].VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Error("StorageClass: want WaitForFirstConsumer, so that the volume gets the topology of the pod's node")
	}
	claims := map[string]bool{}
	for _, pvc := range pvcs {
		if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != sc[0].Name {
			t.Errorf("PVC %s storageClassName %v, want %q", pvc.Name, pvc.Spec.StorageClassName, sc[0].Name)
		}
		claims[pvc.Name] = true
	}
	taint := virtualNodeTaint(t)
	var onVirtual, onHost int
	for _, p := range pods {
		used := 0
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && claims[v.PersistentVolumeClaim.ClaimName] {
				delete(claims, v.PersistentVolumeClaim.ClaimName)
				used++
			}
		}
		if used != 1 {
			t.Errorf("example pod %s uses %d claims of its own, want 1", p.Name, used)
		}
		switch {
		case p.Spec.NodeSelector[nodeowner.Label] == nodeowner.Value && len(p.Spec.NodeSelector) == 1:
			onVirtual++
			if !slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &taint, false) }) {
				t.Errorf("example pod %s does not tolerate the virtual node's taint %s", p.Name, taint.ToString())
			}
		case len(p.Spec.NodeSelector) > 0 && matches(p.Spec.NodeSelector, ds.Spec.Template.Spec.NodeSelector):
			onHost++
		default:
			t.Errorf("example pod %s nodeSelector %v selects neither the agent's Node (%s=%s) nor the agent's host", p.Name, p.Spec.NodeSelector, nodeowner.Label, nodeowner.Value)
		}
	}
	if onVirtual != 1 || onHost != 1 {
		t.Errorf("example: %d pods on %s and %d on the agent's host, want one each", onVirtual, kindVirtualNode, onHost)
	}
}

// hostPathFor returns the host path that path is in the container, through
// the hostPath volume mounted at it or at the deepest directory above it,
// with that mount.
func hostPathFor(tb testing.TB, spec corev1.PodSpec, c *corev1.Container, path string) (string, corev1.VolumeMount) {
	tb.Helper()
	path = filepath.Clean(path)
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		mp := filepath.Clean(m.MountPath)
		if (mp == path || below(path, mp)) && (best == nil || len(mp) > len(filepath.Clean(best.MountPath))) {
			best = &c.VolumeMounts[i]
		}
	}
	if best == nil {
		tb.Fatalf("container %s mounts nothing at or above %s", c.Name, path)
		return "", corev1.VolumeMount{}
	}
	for _, v := range spec.Volumes {
		if v.Name == best.Name && v.HostPath != nil {
			rel, err := filepath.Rel(filepath.Clean(best.MountPath), path)
			if err != nil {
				tb.Fatal(err)
			}
			return filepath.Join(v.HostPath.Path, rel), *best
		}
	}
	tb.Fatalf("container %s mounts %s from volume %s, which is not a hostPath", c.Name, best.MountPath, best.Name)
	return "", corev1.VolumeMount{}
}

// envFromNodeName tells whether the container's variable name is the pod's
// spec.nodeName.
func envFromNodeName(c *corev1.Container, name string) bool {
	return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	})
}

// kindLib returns the plain assignments NAME=value of kind/lib.sh, values
// as written.
func kindLib(tb testing.TB) map[string]string {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("kind", "lib.sh"))
	if err != nil {
		tb.Fatal(err)
	}
	vars := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if m := shellAssignment.FindStringSubmatch(line); m != nil {
			vars[m[1]] = strings.Trim(m[2], `"'`)
		}
	}
	return vars
}

// shellAssignment matches NAME=value at the start of a line.
var shellAssignment = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=(\S*)$`)

// virtualNodeTaint is the taint of the virtual node (VIRTUAL_NODE_TAINT in
// kind/lib.sh), which the agent's or the example runtime's flags set.
func virtualNodeTaint(tb testing.TB) corev1.Taint {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("kind", "lib.sh"))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VIRTUAL_NODE_TAINT="); ok {
			taint, err := parseTaint(strings.Trim(v, `"'`))
			if err != nil {
				tb.Fatalf("kind/lib.sh: %v", err)
			}
			return taint
		}
	}
	tb.Fatal("kind/lib.sh sets no VIRTUAL_NODE_TAINT")
	return corev1.Taint{}
}

// container returns the container called name.
func container(tb testing.TB, spec corev1.PodSpec, name string) *corev1.Container {
	tb.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	tb.Fatalf("no container %s", name)
	return nil
}

// matches tells whether labels satisfy selector.
func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// below tells whether path is strictly below dir.
func below(path, dir string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && rel != "." && !filepath.IsAbs(rel) && rel != ".." && !hasDotDotPrefix(rel)
}

func hasDotDotPrefix(rel string) bool {
	return len(rel) >= 3 && rel[:3] == "../"
}

// yamlUnmarshal decodes YAML (or JSON) into v.
func yamlUnmarshal(data []byte, v any) error {
	return utilyaml.Unmarshal(data, v)
}

// parseTaint parses key[=value]:Effect, as kubectl taint and the kubelet's
// --register-with-taints write it.
func parseTaint(spec string) (corev1.Taint, error) {
	kv, effect, ok := strings.Cut(spec, ":")
	if !ok {
		return corev1.Taint{}, fmt.Errorf("taint %q has no effect", spec)
	}
	key, value, _ := strings.Cut(kv, "=")
	t := corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}
	switch t.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return corev1.Taint{}, fmt.Errorf("taint %q: unknown effect %q", spec, effect)
	}
	if key == "" {
		return corev1.Taint{}, fmt.Errorf("taint %q has no key", spec)
	}
	return t, nil
}
