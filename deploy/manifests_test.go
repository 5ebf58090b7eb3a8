package deploy_test

import (
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The names the manifests give the agent.
const (
	agentNamespace = "csi-volmgr"
	agentName      = "csi-volmgr"
	// kindAgentHost is the kind worker that runs the agent (lib.sh's
	// AGENT_HOST of the cluster csi-volmgr), and kindVirtualNode the node the
	// agent there serves, csi-volmgr-<host>.
	kindAgentHost   = "csi-volmgr-worker"
	kindVirtualNode = "csi-volmgr-" + kindAgentHost
)

// flagValue returns the value of --name in args ("--name=value"; a bare
// "--name" is "true"), and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		switch {
		case a == "--"+name:
			return "true", true
		case strings.HasPrefix(a, "--"+name+"="):
			return strings.TrimPrefix(a, "--"+name+"="), true
		}
	}
	return "", false
}

// agentDaemonSet returns the rendered agent DaemonSet and its container.
func agentDaemonSet(tb testing.TB, objs []*unstructured.Unstructured) (*appsv1.DaemonSet, *corev1.Container) {
	tb.Helper()
	ds := convert[appsv1.DaemonSet](tb, find(tb, objs, "DaemonSet", agentNamespace, agentName))
	for i := range ds.Spec.Template.Spec.Containers {
		if c := &ds.Spec.Template.Spec.Containers[i]; c.Name == agentName {
			return ds, c
		}
	}
	tb.Fatalf("DaemonSet %s has no container %s", agentName, agentName)
	return nil, nil
}

// hostPathMount returns the hostPath volume mounted at mountPath, with the
// mount.
func hostPathMount(tb testing.TB, spec corev1.PodSpec, c *corev1.Container, mountPath string) (*corev1.HostPathVolumeSource, corev1.VolumeMount) {
	tb.Helper()
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Clean(mountPath) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				return v.HostPath, m
			}
		}
		tb.Fatalf("container %s mounts %s from volume %s, which is not a hostPath", c.Name, mountPath, m.Name)
	}
	tb.Fatalf("container %s mounts nothing at %s", c.Name, mountPath)
	return nil, corev1.VolumeMount{}
}

// TestAgentDaemonSet checks what kubelet, mount propagation and the CSI
// node plugins need of the agent's pod, in every overlay.
func TestAgentDaemonSet(t *testing.T) {
	for _, dir := range []string{"base", "kind", "kind/runtime"} {
		t.Run(dir, func(t *testing.T) {
			ds, c := agentDaemonSet(t, render(t, dir))
			spec := ds.Spec.Template.Spec
			if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
				t.Error("the agent container must be privileged (Bidirectional mount propagation)")
			}
			// kind/runtime runs the example runtime, which embeds the
			// agent and has no commands.
			if dir != "kind/runtime" && c.Args[0] != "run" {
				t.Errorf("args start with %q, want the run command", c.Args[0])
			}

			root, ok := flagValue(c.Args, "root-dir")
			if !ok {
				t.Fatal("no --root-dir")
			}
			rootHost, rootMount := hostPathMount(t, spec, c, root)
			if rootMount.MountPropagation == nil || *rootMount.MountPropagation != corev1.MountPropagationBidirectional {
				t.Errorf("--root-dir %s is mounted with propagation %v, want Bidirectional", root, rootMount.MountPropagation)
			}
			// Drivers register host paths of their sockets; the agent can
			// only dial them if the root is at the same path inside.
			if filepath.Clean(rootHost.Path) != filepath.Clean(root) {
				t.Errorf("--root-dir %s is host path %s: the two must be equal", root, rootHost.Path)
			}

			reg, ok := flagValue(c.Args, "registration-dir")
			if !ok {
				t.Fatal("no --registration-dir")
			}
			regHost, _ := hostPathMount(t, spec, c, reg)
			// Under kind the agent shares the kubelet's registration
			// directory instead (TestKindPairing).
			if want := filepath.Join(rootHost.Path, "plugins_registry"); dir == "base" && filepath.Clean(regHost.Path) != want {
				t.Errorf("--registration-dir is host path %s, want %s (the kubelet layout below the root)", regHost.Path, want)
			}
			if strings.HasPrefix(filepath.Clean(reg)+"/", filepath.Clean(root)+"/") {
				t.Errorf("--registration-dir %s is nested below the Bidirectional root mount %s", reg, root)
			}

			// Nothing of the agent on the pod network unless an operator
			// asks for it: the probes ask the API socket.
			if endpoint, ok := flagValue(c.Args, "http-endpoint"); ok {
				host, _, err := net.SplitHostPort(endpoint)
				if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
					t.Errorf("--http-endpoint %s is not loopback: the agent's endpoint would be on the pod network", endpoint)
				}
			}
			for check, p := range map[string]*corev1.Probe{"livez": c.LivenessProbe, "readyz": c.ReadinessProbe} {
				want := []string{"/csi-volmgr", "probe", check, "--root-dir=" + root}
				if p == nil || p.Exec == nil || !slices.Equal(p.Exec.Command, want) {
					t.Errorf("want the exec probe %q, got %+v", want, p)
				}
			}
			// The agent waits for its Node's certificate before it serves
			// the socket the probes ask: the liveness probe must not kill a
			// waiting agent every minute.
			startup := []string{"/csi-volmgr", "probe", "livez", "--root-dir=" + root}
			if p := c.StartupProbe; p == nil || p.Exec == nil || !slices.Equal(p.Exec.Command, startup) {
				t.Errorf("want the exec startup probe %q, got %+v", startup, p)
			} else if wait := time.Duration(p.PeriodSeconds*p.FailureThreshold) * time.Second; wait < 10*time.Minute {
				t.Errorf("the startup probe gives the agent %v to get its certificate, want 10 minutes at least", wait)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("no CPU or memory request: %v", c.Resources.Requests)
			}
			if spec.ServiceAccountName != agentName {
				t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, agentName)
			}
			// The agent acts as its Node, with its certificate on the host
			// below the root, where a restarted pod finds it again. The
			// example runtime embeds the agent and says so its own way.
			certFlag := map[bool]string{true: "node-cert-dir", false: "node-identity"}[dir == "kind/runtime"]
			if v, ok := flagValue(c.Args, certFlag); !ok || v == "" || v == "false" {
				t.Errorf("no --%s: the agent would act as its ServiceAccount, which may only ask for its Node's certificate", certFlag)
			}
			if certDir, ok := flagValue(c.Args, certFlag); ok && certFlag == "node-cert-dir" && !below(certDir, root) {
				t.Errorf("--node-cert-dir=%s is not below the root %s, the host's: a restarted pod would ask for a new certificate", certDir, root)
			}
			if certDir, ok := flagValue(c.Args, "cert-dir"); ok && !below(certDir, root) {
				t.Errorf("--cert-dir=%s is not below the root %s, the host's: a restarted pod would ask for a new certificate", certDir, root)
			}
		})
	}
}

// probePort resolves a probe port (number or container port name) to a
// number.
func probePort(c *corev1.Container, port string) string {
	for _, p := range c.Ports {
		if p.Name == port {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return port
}

// podSpecs returns the pod templates and pods of objs by "Kind ns/name".
func podSpecs(tb testing.TB, objs []*unstructured.Unstructured) map[string]corev1.PodSpec {
	tb.Helper()
	specs := map[string]corev1.PodSpec{}
	for _, o := range objs {
		key := o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		switch o.GetKind() {
		case "DaemonSet":
			specs[key] = convert[appsv1.DaemonSet](tb, o).Spec.Template.Spec
		case "StatefulSet":
			specs[key] = convert[appsv1.StatefulSet](tb, o).Spec.Template.Spec
		case "Deployment":
			specs[key] = convert[appsv1.Deployment](tb, o).Spec.Template.Spec
		case "Pod":
			specs[key] = convert[corev1.Pod](tb, o).Spec
		}
	}
	return specs
}

// TestImagesPinned checks that every image of every manifest names a tag
// other than latest, and that the upstream sidecars come from
// registry.k8s.io/sig-storage.
func TestImagesPinned(t *testing.T) {
	for _, dir := range kustomizations(t) {
		for key, spec := range podSpecs(t, render(t, dir)) {
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				name, tag, ok := strings.Cut(c.Image[strings.LastIndex(c.Image, "/")+1:], ":")
				if !ok || tag == "" || tag == "latest" {
					t.Errorf("%s: %s container %s: image %q is not pinned by tag", dir, key, c.Name, c.Image)
				}
				if strings.HasPrefix(c.Image, "registry.k8s.io/") && !strings.HasPrefix(c.Image, "registry.k8s.io/sig-storage/") && name != "pause" {
					t.Errorf("%s: %s container %s: image %q: want registry.k8s.io/sig-storage", dir, key, c.Name, c.Image)
				}
			}
		}
	}
}

// TestBaseNeverServesItsHost checks that deploy/base, applied to a cluster
// of kubelet nodes, starts no agent that serves a kubelet's Node: the
// DaemonSet runs only on hosts an operator labelled for it, its --node-name
// is not the host's own Node name (spec.nodeName, alone), and it registers
// that Node itself (--register-node), with the owner label the agent needs.
func TestBaseNeverServesItsHost(t *testing.T) {
	ds, c := agentDaemonSet(t, render(t, "base"))
	spec := ds.Spec.Template.Spec
	if got := spec.NodeSelector["csi-volmgr.io/agent-host"]; got != "true" {
		t.Errorf("nodeSelector %v: want csi-volmgr.io/agent-host=true, so that the agent runs only where an operator put it", spec.NodeSelector)
	}
	name, ok := flagValue(c.Args, "node-name")
	if !ok {
		t.Fatal("no --node-name")
	}
	// Resolve the variables the kubelet expands: the host's node name
	// becomes HOST.
	resolved := name
	for _, e := range c.Env {
		value := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			value = "HOST"
		}
		resolved = strings.ReplaceAll(resolved, "$("+e.Name+")", value)
	}
	if resolved == "HOST" || strings.Contains(resolved, "$(") || resolved == "" {
		t.Errorf("--node-name=%s is %q on host HOST: it must name a Node of the agent's own, never the host's", name, resolved)
	}
	if v, ok := flagValue(c.Args, "register-node"); !ok || v != "true" {
		t.Error("no --register-node: the agent's Node must be registered by the agent, with the owner label")
	}
}
