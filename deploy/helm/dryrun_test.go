package helm_test

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }

// dryRun applies objs to the shared API server with a server-side dry-run,
// after creating the namespaces they live in, and returns the errors.
func dryRun(t *testing.T, objs []*unstructured.Unstructured) []error {
	t.Helper()
	d, err := k8stest.Shared(t).NewDryRunner()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.EnsureNamespaces(t.Context(), objs); err != nil {
		t.Fatal(err)
	}
	var errs []error
	for _, o := range objs {
		if _, err := d.Apply(t.Context(), o); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// TestChartDryRun applies the objects helm template renders, with the
// default values and with every option set, to a real kube-apiserver with a
// server-side dry-run: each is decoded, defaulted, validated and admitted as
// `helm install` would have it.
func TestChartDryRun(t *testing.T) {
	for name, vals := range valueSets {
		t.Run(name, func(t *testing.T) {
			objs := renderChart(t, values(t, vals))
			for _, err := range dryRun(t, objs) {
				t.Errorf("server-side dry-run: %v", err)
			}
			t.Logf("%d objects accepted by the API server (dry-run)", len(objs))
		})
	}
}

// TestChartDryRunRejects shows that the dry-run validates for real: a
// toleration that values.schema.json lets through but the API server does
// not know is refused.
func TestChartDryRunRejects(t *testing.T) {
	objs := renderChart(t, values(t, "tolerations: [{key: a, operator: Sometimes}]"))
	errs := dryRun(t, objs)
	if len(errs) != 1 || !apierrors.IsInvalid(errs[0]) || !strings.Contains(errs[0].Error(), "operator") {
		t.Fatalf("dry-run with a bad toleration: got %v, want one Invalid error about the operator", errs)
	}
}
