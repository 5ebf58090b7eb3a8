//go:build upgrade

package helm_test

import (
	"os"
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// EnvPreviousSource names the directory make test-upgrade extracts the
// previous release's tree into (hack/release/previous).
const EnvPreviousSource = "CSI_VOLMGR_PREVIOUS_SRC"

// TestUpgradeChartFromThePreviousRelease is `helm upgrade` from the
// previous release's chart to this one, with the default values, on a real
// kube-apiserver: the previous release's objects are stored (server-side
// apply), then this chart's are applied over them. Every object is
// accepted (an immutable field such as the DaemonSet's selector changed
// would be refused), the objects the new render drops are the ones Helm
// would delete, and the agent's DaemonSet rolls out as an upgrade under
// live volumes needs: RollingUpdate, no surge (two agents cannot share a
// root directory: the second waits on the lock), at most one node at a
// time. The previous release's default values file, given as an
// operator's values, is accepted by this chart's schema.
func TestUpgradeChartFromThePreviousRelease(t *testing.T) {
	src := os.Getenv(EnvPreviousSource)
	if src == "" {
		t.Fatalf("%s is not set: run make test-upgrade, which extracts the previous release", EnvPreviousSource)
	}
	oldDir := filepath.Join(src, "deploy", "helm", "csi-volmgr")
	oldChart, err := loader.Load(oldDir)
	if err != nil {
		t.Fatalf("loading the previous release's chart: %v", err)
	}
	oldObjs, err := templateChartOf(t, oldChart, values(t, ""))
	if err != nil {
		t.Fatalf("helm template of the previous release's chart: %v", err)
	}
	oldValues, err := os.ReadFile(filepath.Join(oldDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := templateChart(t, values(t, string(oldValues))); err != nil {
		t.Errorf("this chart refuses the previous release's values.yaml as an operator's values (helm upgrade -f): %v", err)
	}
	newObjs := renderChart(t, values(t, ""))

	d, err := k8stest.Shared(t).NewDryRunner()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.EnsureNamespaces(t.Context(), append(append([]*unstructured.Unstructured(nil), oldObjs...), newObjs...)); err != nil {
		t.Fatal(err)
	}
	stored := map[string]*unstructured.Unstructured{}
	for _, o := range oldObjs {
		got, err := d.ApplyStored(t.Context(), o)
		if err != nil {
			t.Fatalf("installing the previous release's %s: %v", key(o), err)
		}
		stored[key(o)] = got
	}
	kept := map[string]bool{}
	var rolled *appsv1.DaemonSet
	for _, o := range newObjs {
		kept[key(o)] = true
		got, err := d.ApplyStored(t.Context(), o)
		if err != nil {
			t.Errorf("upgrading %s: %v", key(o), err)
			continue
		}
		if got.GetKind() == "DaemonSet" {
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &ds); err != nil {
				t.Fatal(err)
			}
			if old, ok := stored[key(o)]; ok && old.GetGeneration() != got.GetGeneration() {
				t.Logf("DaemonSet %s: the pod template changed (generation %d → %d): a rollout follows", key(o), old.GetGeneration(), got.GetGeneration())
			}
			rolled = &ds
		}
	}
	for k := range stored {
		if !kept[k] {
			t.Logf("helm upgrade deletes %s, which the previous release had", k)
		}
	}
	if rolled == nil {
		t.Fatal("no DaemonSet in this chart")
	}
	s := rolled.Spec.UpdateStrategy
	if s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil {
		t.Fatalf("DaemonSet update strategy %+v, want RollingUpdate", s)
	}
	if surge := s.RollingUpdate.MaxSurge; surge != nil && surge.IntValue() != 0 {
		t.Errorf("maxSurge %s: a second agent on the node would wait on the root directory's lock", surge)
	}
	if u := s.RollingUpdate.MaxUnavailable; u == nil || u.String() != "1" {
		t.Errorf("maxUnavailable %v, want 1: one node's agent at a time", u)
	}
	t.Logf("%d objects of the previous release, %d of this one applied over them", len(oldObjs), len(newObjs))
}
