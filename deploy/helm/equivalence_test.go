package helm_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// helmLabels are the labels that the chart adds to every object's metadata
// and deploy/base does not have: Helm's release bookkeeping. They are the
// only difference the comparison allows inside an object.
var helmLabels = []string{
	"app.kubernetes.io/instance",
	"app.kubernetes.io/version",
	"app.kubernetes.io/managed-by",
	"helm.sh/chart",
}

// withoutHelmLabels returns copies of the chart's objects without
// helmLabels, failing tb if an object lacks one of them.
func withoutHelmLabels(tb testing.TB, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	tb.Helper()
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		o = o.DeepCopy()
		labels := o.GetLabels()
		for _, l := range helmLabels {
			if _, ok := labels[l]; !ok {
				tb.Errorf("%s: the chart's %s %s has no label %s", key(o), o.GetKind(), o.GetName(), l)
			}
			delete(labels, l)
		}
		o.SetLabels(labels)
		out = append(out, o)
	}
	return out
}

// withoutNamespace returns objs without the Namespace object named ns,
// failing tb if there is none. Helm installs into the release's namespace,
// which exists before the install (`helm install -n NS --create-namespace`
// or an operator's Namespace with the pod-security labels of
// deploy/base/namespace.yaml); a chart cannot own it.
func withoutNamespace(tb testing.TB, objs []*unstructured.Unstructured, ns string) []*unstructured.Unstructured {
	tb.Helper()
	n := find(objs, "Namespace", "", ns)
	if n == nil {
		tb.Fatalf("deploy/base has no Namespace %s", ns)
	}
	return slices.DeleteFunc(slices.Clone(objs), func(o *unstructured.Unstructured) bool { return o == n })
}

// key names an object by API group, kind, namespace and name.
func key(o *unstructured.Unstructured) string {
	gvk := o.GroupVersionKind()
	return fmt.Sprintf("%s/%s %s/%s", gvk.Group, gvk.Kind, o.GetNamespace(), o.GetName())
}

// diffObjects lists how got differs from want: objects missing or extra,
// and for objects in both, every field that differs (go-cmp's diff).
func diffObjects(want, got []*unstructured.Unstructured) []string {
	index := func(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
		m := make(map[string]*unstructured.Unstructured, len(objs))
		for _, o := range objs {
			m[key(o)] = o
		}
		return m
	}
	w, g := index(want), index(got)
	var diffs []string
	for k, wo := range w {
		gos, ok := g[k]
		if !ok {
			diffs = append(diffs, "missing "+k)
			continue
		}
		if d := cmp.Diff(wo.Object, gos.Object); d != "" {
			diffs = append(diffs, fmt.Sprintf("%s (-kustomize +chart):\n%s", k, d))
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			diffs = append(diffs, "extra "+k)
		}
	}
	if len(want) != len(w) || len(got) != len(g) {
		diffs = append(diffs, "an object is rendered twice")
	}
	slices.Sort(diffs)
	return diffs
}

// TestChartDefaultsMatchBase shows that the chart with its default values
// renders the objects of `kubectl kustomize deploy/base`, field for field,
// but for Helm's labels and the Namespace.
func TestChartDefaultsMatchBase(t *testing.T) {
	want := withoutNamespace(t, kustomize(t, "base"), releaseNamespace)
	got := withoutHelmLabels(t, renderChart(t, nil))
	if diffs := diffObjects(want, got); len(diffs) != 0 {
		t.Fatalf("the chart with default values differs from deploy/base:\n%s", strings.Join(diffs, "\n"))
	}
	t.Logf("%d objects equal", len(got))
}

// TestDiffObjectsFindsDifferences shows that the comparison fires: a changed
// or missing flag of the agent or of the approver, a changed node selector,
// an extra object, and a label outside helmLabels are each reported.
func TestDiffObjectsFindsDifferences(t *testing.T) {
	base := withoutNamespace(t, kustomize(t, "base"), releaseNamespace)
	for _, tc := range []struct {
		name, want string
		vals       string
		edit       func(objs []*unstructured.Unstructured) []*unstructured.Unstructured
	}{
		{name: "verbosity", vals: "verbosity: 5", want: "--v=5"},
		{name: "no register-node", vals: "registerNode: false", want: "--register-node"},
		{name: "approver's node name prefix", vals: "nodeName: edge-$(NODE_NAME)", want: "--node-name-prefix=edge-"},
		{name: "approver's hosts", vals: `csrApprover: {nodeSelector: {example.com/trusted: "yes"}}`, want: "example.com/trusted"},
		{name: "approver kept off another agent host label", vals: `nodeSelector: {example.com/edge: "yes"}`, want: "example.com/edge"},
		{name: "runtime API binding", vals: "runtimeAPI: {subjects: [{kind: User, name: alice}]}", want: "extra rbac.authorization.k8s.io/ClusterRoleBinding /csi-volmgr-runtime-api"},
		{name: "label", want: "example.com/extra", edit: func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
			o := objs[0]
			l := o.GetLabels()
			l["example.com/extra"] = "x"
			o.SetLabels(l)
			return objs
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := withoutHelmLabels(t, renderChart(t, values(t, tc.vals)))
			if tc.edit != nil {
				got = tc.edit(got)
			}
			diffs := strings.Join(diffObjects(base, got), "\n")
			if !strings.Contains(diffs, tc.want) {
				t.Fatalf("the comparison does not report %q; it reports:\n%s", tc.want, diffs)
			}
		})
	}
}
