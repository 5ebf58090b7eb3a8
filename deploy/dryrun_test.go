package deploy_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// fieldManager is the server-side apply field manager of the dry-runs.
const fieldManager = "csi-volmgr-deploy-test"

// dryRunner applies objects with server-side apply and dryRun=All: the API
// server decodes, defaults, validates and admits each object (schema,
// RBAC object shapes, pod security, DaemonSet pod templates) and stores
// nothing.
type dryRunner struct {
	env    *k8stest.Env
	client dynamic.Interface
	mapper meta.RESTMapper
}

func newDryRunner(tb testing.TB, env *k8stest.Env) *dryRunner {
	tb.Helper()
	client, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		tb.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		tb.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(disco)
	if err != nil {
		tb.Fatalf("API discovery: %v", err)
	}
	return &dryRunner{env: env, client: client, mapper: restmapper.NewDiscoveryRESTMapper(groups)}
}

// apply dry-runs u and returns the object as the API server would store it.
func (d *dryRunner) apply(tb testing.TB, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	tb.Helper()
	gvk := u.GroupVersionKind()
	mapping, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s is not served by the API server: %w", gvk, err)
	}
	var res dynamic.ResourceInterface = d.client.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s has no namespace: the manifests must name it", gvk.Kind, u.GetName())
		}
		res = d.client.Resource(mapping.Resource).Namespace(u.GetNamespace())
	}
	return res.Apply(tb.Context(), u.GetName(), u, metav1.ApplyOptions{
		FieldManager: fieldManager, Force: true, DryRun: []string{metav1.DryRunAll},
	})
}

// ensureNamespaces creates, for real, the namespaces that the objects live
// in: a dry-run does not store the Namespace objects of the manifests, and
// admission rejects objects in a namespace that does not exist.
func ensureNamespaces(tb testing.TB, env *k8stest.Env, objs []*unstructured.Unstructured) {
	tb.Helper()
	for _, o := range objs {
		ns := o.GetNamespace()
		if o.GetKind() == "Namespace" {
			ns = o.GetName()
		}
		if ns == "" {
			continue
		}
		_, err := env.Client.CoreV1().Namespaces().Create(tb.Context(),
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			tb.Fatalf("creating namespace %s: %v", ns, err)
		}
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
			ensureNamespaces(t, env, objs)
			for _, o := range objs {
				if _, err := d.apply(t, o); err != nil {
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
	ensureNamespaces(t, env, objs)
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
	_, err = d.apply(t, ds)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "Bidirectional") {
		t.Fatalf("dry-run of the DaemonSet without privileged: got %v, want an Invalid error about Bidirectional mount propagation", err)
	}
}
