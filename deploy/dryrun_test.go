package deploy_test

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// newDryRunner returns a server-side dry-run client of env.
func newDryRunner(tb testing.TB, env *k8stest.Env) *k8stest.DryRunner {
	tb.Helper()
	d, err := env.NewDryRunner()
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// ensureNamespaces creates the namespaces that objs live in.
func ensureNamespaces(tb testing.TB, d *k8stest.DryRunner, objs []*unstructured.Unstructured) {
	tb.Helper()
	if err := d.EnsureNamespaces(tb.Context(), objs); err != nil {
		tb.Fatal(err)
	}
}

// TestManifestsDryRun renders every kustomization under deploy/ with the
// kubectl built from the same Kubernetes release as the test API server,
// and applies every object with a server-side dry-run.
func TestManifestsDryRun(t *testing.T) {
	env, _ := apiServer(t)
	d := newDryRunner(t, env)
	for _, dir := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			ensureNamespaces(t, d, objs)
			for _, o := range objs {
				if _, err := d.Apply(t.Context(), o); err != nil {
					t.Errorf("server-side dry-run of %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
			t.Logf("%s: %d objects accepted by the API server (dry-run)", dir, len(objs))
		})
	}
}

// TestDryRunRejectsBrokenDaemonSet shows that the dry-run validates for
// real: the agent's DaemonSet without privileged is rejected, because the
// API server allows Bidirectional mount propagation only to privileged
// containers.
func TestDryRunRejectsBrokenDaemonSet(t *testing.T) {
	env, _ := apiServer(t)
	d := newDryRunner(t, env)
	objs := render(t, "base")
	ensureNamespaces(t, d, objs)
	ds := find(t, objs, "DaemonSet", "csi-volmgr", "csi-volmgr").DeepCopy()
	containers, _, err := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) == 0 {
		t.Fatalf("DaemonSet has no containers: %v", err)
	}
	c := containers[0].(map[string]any)
	delete(c, "securityContext")
	if err := unstructured.SetNestedSlice(ds.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
	_, err = d.Apply(t.Context(), ds)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Bidirectional") {
		t.Fatalf("dry-run of the DaemonSet without privileged: got %v, want an Invalid error about Bidirectional mount propagation", err)
	}
}
