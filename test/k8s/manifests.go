package k8stest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// DryRunFieldManager is the server-side apply field manager of DryRunner.
const DryRunFieldManager = "csi-volmgr-deploy-test"

// DryRunner applies manifests' objects with server-side apply and
// dryRun=All: the API server decodes, defaults, validates and admits each
// object (schema, RBAC object shapes, pod security, DaemonSet pod templates)
// and stores nothing. The kustomizations under deploy/ and the Helm chart
// are held to the API server through it.
type DryRunner struct {
	env    *Env
	client dynamic.Interface
	mapper meta.RESTMapper
}

// NewDryRunner returns a DryRunner on e, with the resources the API server
// serves as discovery lists them now.
func (e *Env) NewDryRunner() (*DryRunner, error) {
	client, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		return nil, err
	}
	groups, err := restmapper.GetAPIGroupResources(disco)
	if err != nil {
		return nil, fmt.Errorf("API discovery: %w", err)
	}
	return &DryRunner{env: e, client: client, mapper: restmapper.NewDiscoveryRESTMapper(groups)}, nil
}

// Apply dry-runs u and returns the object as the API server would store it.
func (d *DryRunner) Apply(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return d.apply(ctx, u, []string{metav1.DryRunAll})
}

// ApplyStored applies u for real (server-side apply, the same field
// manager) and returns the object as the API server stored it: for tests
// that apply one render over another, as an upgrade does.
func (d *DryRunner) ApplyStored(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return d.apply(ctx, u, nil)
}

func (d *DryRunner) apply(ctx context.Context, u *unstructured.Unstructured, dryRun []string) (*unstructured.Unstructured, error) {
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
	return res.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{
		FieldManager: DryRunFieldManager, Force: true, DryRun: dryRun,
	})
}

// EnsureNamespaces creates, for real, the namespaces that objs live in: a
// dry-run does not store the Namespace objects of the manifests, and
// admission rejects objects in a namespace that does not exist.
func (d *DryRunner) EnsureNamespaces(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		ns := o.GetNamespace()
		if o.GetKind() == "Namespace" {
			ns = o.GetName()
		}
		if ns == "" {
			continue
		}
		_, err := d.env.Client.CoreV1().Namespaces().Create(ctx,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	return nil
}

// DecodeManifests decodes a multi-document YAML stream (kubectl kustomize's
// or helm template's output) into objects; empty documents are skipped, and
// an object without kind or name is an error.
func DecodeManifests(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decoding YAML: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("object without kind or name: %v", m)
		}
		objs = append(objs, u)
	}
}

// Convert turns u into the typed object T, failing tb when u has a field T
// does not know.
func Convert[T any](tb testing.TB, u *unstructured.Unstructured) *T {
	tb.Helper()
	t := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, t, true); err != nil {
		tb.Fatalf("%s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return t
}
