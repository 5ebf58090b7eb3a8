package helm_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// TestChartOptions renders allOptions and finds every option where it takes
// effect.
func TestChartOptions(t *testing.T) {
	objs := renderChart(t, values(t, allOptions))
	const name = "edge-volmgr"
	ds := k8stest.Convert[appsv1.DaemonSet](t, mustFind(t, objs, "DaemonSet", releaseNamespace, name))
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]

	if got := ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"]; got != "volmgr" {
		t.Errorf("nameOverride: selector name %q, want volmgr", got)
	}
	if c.Image != "registry.example/csi-volmgr:v9.9.9" || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image: %s (%s)", c.Image, c.ImagePullPolicy)
	}
	if want := []corev1.LocalObjectReference{{Name: "regcred"}}; !slices.Equal(spec.ImagePullSecrets, want) {
		t.Errorf("imagePullSecrets: %v", spec.ImagePullSecrets)
	}
	// Helm merges a map value into the default's: the host selector stays
	// unless set to null.
	wantSelector := map[string]string{"example.com/edge": "yes", "csi-volmgr.io/agent-host": "true"}
	if d := cmp.Diff(wantSelector, spec.NodeSelector); d != "" {
		t.Errorf("nodeSelector (-want +got):\n%s", d)
	}
	wantTol := []corev1.Toleration{{Key: "example.com/edge", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	if d := cmp.Diff(wantTol, spec.Tolerations); d != "" {
		t.Errorf("tolerations (-want +got):\n%s", d)
	}
	wantArgs := []string{
		"run", "--node-name=edge-$(NODE_NAME)", "--wait-for-containers-stopped", "--node-identity", "--root-dir=/srv/csi-volmgr", "--registration-dir=/registration",
		"--http-endpoint=:9810", "--v=4", "--logging-format=json", "--expected-drivers=hostpath.csi.k8s.io",
	}
	if d := cmp.Diff(wantArgs, c.Args); d != "" {
		t.Errorf("args (-want +got):\n%s", d)
	}
	if want := []corev1.ContainerPort{{Name: "https", ContainerPort: 9810, Protocol: corev1.ProtocolTCP}}; !slices.Equal(c.Ports, want) {
		t.Errorf("http.expose: ports %v, want %v", c.Ports, want)
	}
	for probe, p := range map[string]*corev1.Probe{"livez": c.LivenessProbe, "readyz": c.ReadinessProbe} {
		if want := []string{"/csi-volmgr", "probe", probe, "--root-dir=/srv/csi-volmgr"}; !slices.Equal(p.Exec.Command, want) {
			t.Errorf("%s probe: %v, want %v", probe, p.Exec.Command, want)
		}
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	if !equality(c.Resources, wantRes) {
		t.Errorf("resources: %v, want %v", c.Resources, wantRes)
	}
	wantMounts := map[string][2]string{ // mount path: host path, propagation
		"/srv/csi-volmgr": {"/srv/csi-volmgr", "Bidirectional"},
		"/registration":   {"/srv/registry", ""},
		"/dev":            {"/dev", ""},
	}
	if len(c.VolumeMounts) != len(wantMounts) {
		t.Errorf("volume mounts: %v", c.VolumeMounts)
	}
	for _, m := range c.VolumeMounts {
		want, ok := wantMounts[m.MountPath]
		host := hostPath(spec, m.Name)
		prop := ""
		if m.MountPropagation != nil {
			prop = string(*m.MountPropagation)
		}
		if !ok || host != want[0] || prop != want[1] {
			t.Errorf("mount %s: host path %q, propagation %q; want %q", m.MountPath, host, prop, want)
		}
	}

	// registerNode: false leaves out the flag and waits for the runtime
	// (--wait-for-containers-stopped, above); the agent acts as
	// its Node either way, with no grant but the bootstrap binding of its
	// ServiceAccount.
	crb := k8stest.Convert[rbacv1.ClusterRoleBinding](t, mustFind(t, objs, "ClusterRoleBinding", "", name+"-bootstrap"))
	wantSubj := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: releaseNamespace}}
	if crb.RoleRef.Name != "system:node-bootstrapper" || !slices.Equal(crb.Subjects, wantSubj) {
		t.Errorf("bootstrap binding: %v %v", crb.RoleRef, crb.Subjects)
	}
	for _, o := range objs {
		if (o.GetKind() == "ClusterRole" || o.GetKind() == "Role") && !strings.HasSuffix(o.GetName(), "-runtime-api") && !strings.HasSuffix(o.GetName(), "-api-reader") && !strings.HasSuffix(o.GetName(), "-csr-approver") {
			t.Errorf("%s %s/%s: the agent acts as its Node and needs no role of its own", o.GetKind(), o.GetNamespace(), o.GetName())
		}
	}

	// csrApprover: the approver of the agents' certificates for the
	// prefix of nodeName, the release's ServiceAccount, on the hosts of
	// csrApprover.nodeSelector and off those of nodeSelector.
	dep := k8stest.Convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", releaseNamespace, name+"-csr-approver"))
	aspec := dep.Spec.Template.Spec
	ac := aspec.Containers[0]
	wantApproverArgs := []string{
		"approve-node-csrs", "--node-name-prefix=edge-", "--agent-service-account=" + releaseNamespace + "/" + name,
		"--bootstrap-group-prefix=system:bootstrappers:csi-volmgr:", "--health-endpoint=:9810", "--v=4", "--logging-format=json",
	}
	if d := cmp.Diff(wantApproverArgs, ac.Args); d != "" {
		t.Errorf("approver args (-want +got):\n%s", d)
	}
	if ac.Image != c.Image || ac.ImagePullPolicy != corev1.PullAlways || !slices.Equal(aspec.ImagePullSecrets, spec.ImagePullSecrets) {
		t.Errorf("approver image %s (%s), pull secrets %v: want the agent's", ac.Image, ac.ImagePullPolicy, aspec.ImagePullSecrets)
	}
	if want := map[string]string{"example.com/trusted": "yes"}; !maps.Equal(aspec.NodeSelector, want) {
		t.Errorf("csrApprover.nodeSelector: %v, want %v", aspec.NodeSelector, want)
	}
	wantATol := []corev1.Toleration{{Key: "example.com/trusted", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	if d := cmp.Diff(wantATol, aspec.Tolerations); d != "" {
		t.Errorf("csrApprover.tolerations (-want +got):\n%s", d)
	}
	wantARes := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}
	if !equality(ac.Resources, wantARes) {
		t.Errorf("csrApprover.resources: %v, want %v", ac.Resources, wantARes)
	}
	// Off every agent host: a term per key of the agents' nodeSelector,
	// so that a host matching all of them matches no term.
	var terms []corev1.NodeSelectorTerm
	for _, k := range slices.Sorted(maps.Keys(wantSelector)) {
		terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: k, Operator: corev1.NodeSelectorOpNotIn, Values: []string{wantSelector[k]},
		}}})
	}
	if a := aspec.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Errorf("approver affinity %+v: want it kept off the agents' hosts", a)
	} else if d := cmp.Diff(terms, a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms); d != "" {
		t.Errorf("approver node affinity (-want +got):\n%s", d)
	}
	acrb := k8stest.Convert[rbacv1.ClusterRoleBinding](t, mustFind(t, objs, "ClusterRoleBinding", "", name+"-csr-approver"))
	if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name + "-csr-approver", Namespace: releaseNamespace}}; acrb.RoleRef.Name != name+"-csr-approver" || !slices.Equal(acrb.Subjects, want) {
		t.Errorf("approver binding: %v %v", acrb.RoleRef, acrb.Subjects)
	}

	// runtimeAPI.subjects: bound to the runtime's write role and to the
	// reader; apiReader.subjects to the reader only.
	runtime := rbacv1.Subject{Kind: "ServiceAccount", Name: "runtime", Namespace: "runtime"}
	reader := rbacv1.Subject{Kind: "User", Name: "alice"}
	rcrb := k8stest.Convert[rbacv1.ClusterRoleBinding](t, mustFind(t, objs, "ClusterRoleBinding", "", name+"-runtime-api"))
	if want := []rbacv1.Subject{runtime}; rcrb.RoleRef.Name != name+"-runtime-api" || !slices.Equal(rcrb.Subjects, want) {
		t.Errorf("runtime API binding: %v %v", rcrb.RoleRef, rcrb.Subjects)
	}
	gcrb := k8stest.Convert[rbacv1.ClusterRoleBinding](t, mustFind(t, objs, "ClusterRoleBinding", "", name+"-api-reader"))
	if want := []rbacv1.Subject{runtime, reader}; gcrb.RoleRef.Name != name+"-api-reader" || !slices.Equal(gcrb.Subjects, want) {
		t.Errorf("API reader binding: %v %v", gcrb.RoleRef, gcrb.Subjects)
	}
	for role, verbs := range map[string][]string{name + "-runtime-api": {"create", "update"}, name + "-api-reader": {"get"}} {
		cr := k8stest.Convert[rbacv1.ClusterRole](t, mustFind(t, objs, "ClusterRole", "", role))
		if len(cr.Rules) != 1 || !slices.Equal(cr.Rules[0].Verbs, verbs) || !slices.Equal(cr.Rules[0].Resources, []string{"nodes/csi-volmgr"}) {
			t.Errorf("ClusterRole %s: %+v, want %v on nodes/csi-volmgr only", role, cr.Rules, verbs)
		}
	}
}

// TestChartHTTPEndpoint shows the three shapes of the HTTP endpoint: the
// agent's default (no flag, no port), another port still on 127.0.0.1, and
// the pod IP with the container port "https". None serves plain HTTP: the
// agent serves TLS unless told --http-endpoint-plaintext, which it refuses
// on the pod IP.
func TestChartHTTPEndpoint(t *testing.T) {
	for _, tc := range []struct {
		vals  string
		flag  string
		ports int
	}{
		{vals: "", flag: ""},
		{vals: "http: {expose: false, port: 9900}", flag: "--http-endpoint=127.0.0.1:9900"},
		{vals: "http: {expose: true, port: 9809}", flag: "--http-endpoint=:9809", ports: 1},
	} {
		t.Run(tc.vals, func(t *testing.T) {
			objs := renderChart(t, values(t, tc.vals))
			c := k8stest.Convert[appsv1.DaemonSet](t, mustFind(t, objs, "DaemonSet", releaseNamespace, releaseName)).Spec.Template.Spec.Containers[0]
			var flag string
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--http-endpoint-plaintext") {
					t.Errorf("the chart sets %s: the endpoint must serve TLS", a)
				} else if strings.HasPrefix(a, "--http-endpoint") {
					flag = a
				}
			}
			if flag != tc.flag || len(c.Ports) != tc.ports {
				t.Fatalf("flag %q and %d ports, want %q and %d", flag, len(c.Ports), tc.flag, tc.ports)
			}
		})
	}
}

// TestChartNodeSelectorReplaced shows how to replace the host selector:
// Helm merges a nodeSelector value into the default, and a key set to null
// leaves it.
func TestChartNodeSelectorReplaced(t *testing.T) {
	objs := renderChart(t, values(t, `nodeSelector: {csi-volmgr.io/agent-host: null, example.com/edge: "yes"}`))
	spec := k8stest.Convert[appsv1.DaemonSet](t, mustFind(t, objs, "DaemonSet", releaseNamespace, releaseName)).Spec.Template.Spec
	if want := map[string]string{"example.com/edge": "yes"}; !maps.Equal(spec.NodeSelector, want) {
		t.Fatalf("nodeSelector %v, want %v", spec.NodeSelector, want)
	}
}

// TestChartRejects shows that values the agent cannot run with fail the
// render with an error naming them, from values.schema.json or from the
// templates.
func TestChartRejects(t *testing.T) {
	for vals, want := range map[string]string{
		"registerNodes: true":                              "'registerNodes' not allowed",
		"rootDir: var/lib/csi-volmgr":                      "'/rootDir'",
		"registrationDir: /var/lib/csi-volmgr/":            "registrationDir \"/var/lib/csi-volmgr/\" is rootDir",
		"http: {expose: true, port: 0}":                    "'/http/port'",
		"logFormat: yaml":                                  "'/logFormat'",
		"extraArgs: [run]":                                 "'/extraArgs/0'",
		"image: {repository: \"\"}":                        "'/image/repository'",
		"nodeName: csi-volmgr-edge":                        "must end with $(NODE_NAME)",
		"nodeName: $(NODE_NAME)":                           "is the host's own Node",
		"nodeSelector: {csi-volmgr.io/agent-host: null}":   "nodeSelector is empty",
		"csrApprover: {replicas: 2}":                       "'replicas' not allowed",
		"csrApprover: {nodeSelector: {a: 1}}":              "'/csrApprover/nodeSelector/a'",
		"runtimeAPI: {subjects: [{kind: Robot, name: r}]}": "'/runtimeAPI/subjects/0/kind'",
	} {
		t.Run(vals, func(t *testing.T) {
			_, err := templateChart(t, values(t, vals))
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("helm template with %q: got %v, want an error naming %q", vals, err, want)
			}
		})
	}
}

// hostPath returns the host path of the hostPath volume name in spec.
func hostPath(spec corev1.PodSpec, name string) string {
	for _, v := range spec.Volumes {
		if v.Name == name && v.HostPath != nil {
			return v.HostPath.Path
		}
	}
	return ""
}

// equality compares resource requirements by quantity value.
func equality(a, b corev1.ResourceRequirements) bool {
	same := func(x, y corev1.ResourceList) bool {
		if len(x) != len(y) {
			return false
		}
		for k, q := range x {
			if p, ok := y[k]; !ok || p.Cmp(q) != 0 {
				return false
			}
		}
		return true
	}
	return same(a.Requests, b.Requests) && same(a.Limits, b.Limits) && len(a.Claims) == 0 && len(b.Claims) == 0
}
