package deploy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"
)

// kindCluster is the part of kind's v1alpha4 Cluster config the test reads.
type kindCluster struct {
	Nodes []struct {
		Role   string            `json:"role"`
		Labels map[string]string `json:"labels"`
	} `json:"nodes"`
}

// TestKindPairing checks that the pieces of deploy/kind fit together, since
// kind cannot run here: the agent serves the virtual node, the hostpath
// driver runs on the agent's host, registers into the agent's registration
// directory and mounts where the agent looks, and the example pod lands on
// the virtual node with a claim of the driver.
func TestKindPairing(t *testing.T) {
	objs := render(t, "kind")
	ds, agent := agentDaemonSet(t, objs)

	if got, _ := flagValue(agent.Args, "node-name"); got != virtualNode {
		t.Errorf("--node-name=%q, want %q", got, virtualNode)
	}
	if v, ok := flagValue(agent.Args, "register-node"); !ok || v != "true" {
		t.Error("the agent of a node without kubelet needs --register-node")
	}
	root, _ := flagValue(agent.Args, "root-dir")
	rootHost, _ := hostPathMount(t, ds.Spec.Template.Spec, agent, root)
	reg, _ := flagValue(agent.Args, "registration-dir")
	regHost, _ := hostPathMount(t, ds.Spec.Template.Spec, agent, reg)

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
		t.Errorf("%d kind nodes match the agent's nodeSelector %v; exactly one agent may serve %s", hosts, ds.Spec.Template.Spec.NodeSelector, virtualNode)
	}

	// The driver.
	sts := convert[appsv1.StatefulSet](t, find(t, objs, "StatefulSet", agentNamespace, "csi-hostpathplugin"))
	spec := sts.Spec.Template.Spec
	if !matches(ds.Spec.Template.Spec.NodeSelector, spec.NodeSelector) || len(spec.NodeSelector) == 0 {
		t.Errorf("the driver's nodeSelector %v does not put it on the agent's host (%v)", spec.NodeSelector, ds.Spec.Template.Spec.NodeSelector)
	}
	plugin := container(t, spec, "hostpath")
	registrar := container(t, spec, "node-driver-registrar")
	driverName, _ := flagValue(plugin.Args, "drivername")
	if nodeID, _ := flagValue(plugin.Args, "nodeid"); nodeID != virtualNode {
		t.Errorf("hostpath --nodeid=%q, want the virtual node %q", nodeID, virtualNode)
	}
	socket, _ := flagValue(registrar.Args, "kubelet-registration-path")
	if filepath.Dir(filepath.Clean(socket)) == filepath.Clean(socket) || !below(socket, rootHost.Path) {
		t.Errorf("--kubelet-registration-path=%s is not below the agent's root %s: the agent cannot dial it", socket, rootHost.Path)
	}
	csiAddr, _ := flagValue(registrar.Args, "csi-address")
	socketDir, _ := hostPathMount(t, spec, registrar, filepath.Dir(csiAddr))
	if filepath.Clean(socketDir.Path) != filepath.Dir(filepath.Clean(socket)) {
		t.Errorf("the registrar's --csi-address dir is host path %s, but it registers %s", socketDir.Path, socket)
	}
	regDir, _ := hostPathMount(t, spec, registrar, "/registration")
	if filepath.Clean(regDir.Path) != filepath.Clean(regHost.Path) {
		t.Errorf("the registrar registers into host path %s, the agent watches %s", regDir.Path, regHost.Path)
	}
	for _, sub := range []string{"pods", "plugins"} {
		path := filepath.Join(root, sub)
		host, m := hostPathMount(t, spec, plugin, path)
		if filepath.Clean(host.Path) != filepath.Join(rootHost.Path, sub) {
			t.Errorf("the driver mounts host path %s at %s, want %s", host.Path, path, filepath.Join(rootHost.Path, sub))
		}
		if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Errorf("the driver's %s mount must be Bidirectional so that its mounts reach the agent", path)
		}
	}

	// The CSIDriver, for the attach/detach controller.
	drv := convert[storagev1.CSIDriver](t, find(t, objs, "CSIDriver", "", driverName))
	if drv.Spec.AttachRequired == nil || !*drv.Spec.AttachRequired {
		t.Errorf("CSIDriver %s: want attachRequired, so that the VolumeAttachment path is exercised", driverName)
	}
	if enable, _ := flagValue(plugin.Args, "enable-attach"); enable != "true" {
		t.Error("hostpath needs --enable-attach to pair with csi-attacher")
	}

	// The example workload.
	example := render(t, filepath.Join("kind", "example"))
	sc := ofKind[storagev1.StorageClass](t, example, "StorageClass")
	pvc := ofKind[corev1.PersistentVolumeClaim](t, example, "PersistentVolumeClaim")
	pod := ofKind[corev1.Pod](t, example, "Pod")
	if len(sc) != 1 || len(pvc) != 1 || len(pod) != 1 {
		t.Fatalf("example: want one StorageClass, PVC and Pod, got %d, %d, %d", len(sc), len(pvc), len(pod))
	}
	if sc[0].Provisioner != driverName {
		t.Errorf("StorageClass provisioner %q, want %q", sc[0].Provisioner, driverName)
	}
	if sc[0].VolumeBindingMode == nil || *sc[0].VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Error("StorageClass: want WaitForFirstConsumer, so that the volume gets the virtual node's topology")
	}
	if pvc[0].Spec.StorageClassName == nil || *pvc[0].Spec.StorageClassName != sc[0].Name {
		t.Errorf("PVC storageClassName %v, want %q", pvc[0].Spec.StorageClassName, sc[0].Name)
	}
	p := pod[0]
	if p.Spec.NodeSelector[corev1.LabelHostname] != virtualNode {
		t.Errorf("example pod nodeSelector %v does not select %s", p.Spec.NodeSelector, virtualNode)
	}
	if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
		return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc[0].Name
	}) {
		t.Errorf("example pod does not use PVC %s", pvc[0].Name)
	}
	taint := virtualNodeTaint(t)
	if !slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &taint, false) }) {
		t.Errorf("example pod does not tolerate the virtual node's taint %s", taint.ToString())
	}
}

// virtualNodeTaint is the taint that kind/up.sh puts on the virtual node
// (VIRTUAL_NODE_TAINT in kind/lib.sh).
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
