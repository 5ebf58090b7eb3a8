package helm_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

const (
	// chartDir is the chart under test.
	chartDir = "csi-volmgr"
	// releaseName and releaseNamespace are those of deploy/base: a release
	// named csi-volmgr names its objects as deploy/base does.
	releaseName      = "csi-volmgr"
	releaseNamespace = "csi-volmgr"
)

// allOptions sets every value of values.yaml away from its default.
const allOptions = `
image:
  repository: registry.example/csi-volmgr
  tag: v9.9.9
  pullPolicy: Always
imagePullSecrets: [{name: regcred}]
nameOverride: volmgr
fullnameOverride: edge-volmgr
nodeSelector: {example.com/edge: "yes"}
tolerations: [{key: example.com/edge, operator: Exists, effect: NoSchedule}]
nodeName: edge-$(NODE_NAME)
registerNode: false
rootDir: /srv/csi-volmgr
registrationDir: /srv/registry
http: {expose: true, port: 9810}
runtimeAPI:
  subjects: [{kind: ServiceAccount, name: runtime, namespace: runtime}]
apiReader:
  subjects: [{kind: User, name: alice}]
csrApprover:
  nodeSelector: {node-role.kubernetes.io/control-plane: null, example.com/trusted: "yes"}
  tolerations: [{key: example.com/trusted, operator: Exists, effect: NoSchedule}]
  resources:
    requests: {cpu: 5m, memory: 16Mi}
resources:
  requests: {cpu: 50m, memory: 128Mi}
  limits: {memory: 256Mi}
verbosity: 4
logFormat: json
extraArgs: [--expected-drivers=hostpath.csi.k8s.io]
`

// valueSets are the values that lint, render and dry-run are tried with.
var valueSets = map[string]string{
	"defaults":    "",
	"all options": allOptions,
}

// values parses a values file's content.
func values(tb testing.TB, yaml string) map[string]any {
	tb.Helper()
	v, err := chartutil.ReadValues([]byte(yaml))
	if err != nil {
		tb.Fatalf("values: %v", err)
	}
	return v
}

// loadChart loads the chart from its directory.
func loadChart(tb testing.TB) *chart.Chart {
	tb.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		tb.Fatalf("loading the chart: %v", err)
	}
	return c
}

// templateChart renders the chart as `helm template csi-volmgr
// deploy/helm/csi-volmgr -n csi-volmgr` does: an install with a client-only
// dry-run, which validates the values against values.schema.json and
// renders every template without an API server.
func templateChart(tb testing.TB, vals map[string]any) ([]*unstructured.Unstructured, error) {
	tb.Helper()
	return templateChartOf(tb, loadChart(tb), vals)
}

// templateChartOf is templateChart of the chart c (e.g. an earlier
// release's).
func templateChartOf(tb testing.TB, c *chart.Chart, vals map[string]any) ([]*unstructured.Unstructured, error) {
	tb.Helper()
	install := action.NewInstall(&action.Configuration{Log: func(format string, v ...any) { tb.Logf(format, v...) }})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = releaseName
	install.Namespace = releaseNamespace
	rel, err := install.RunWithContext(tb.Context(), c, vals)
	if err != nil {
		return nil, err
	}
	if len(rel.Hooks) != 0 {
		tb.Fatalf("the chart has %d hooks; deploy/base has none", len(rel.Hooks))
	}
	return k8stest.DecodeManifests(bytes.NewBufferString(rel.Manifest))
}

// renderChart is templateChart that fails tb on an error.
func renderChart(tb testing.TB, vals map[string]any) []*unstructured.Unstructured {
	tb.Helper()
	objs, err := templateChart(tb, vals)
	if err != nil {
		tb.Fatalf("helm template: %v", err)
	}
	if len(objs) == 0 {
		tb.Fatal("helm template rendered no object")
	}
	return objs
}

// kustomize renders the kustomization deploy/<dir> with kustomize's Go API
// (krusty, the version kubectl v1.37 embeds), as `kubectl kustomize` does.
func kustomize(tb testing.TB, dir string) []*unstructured.Unstructured {
	tb.Helper()
	path, err := filepath.Abs(filepath.Join("..", dir))
	if err != nil {
		tb.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), path)
	if err != nil {
		tb.Fatalf("kustomize deploy/%s: %v", dir, err)
	}
	y, err := m.AsYaml()
	if err != nil {
		tb.Fatalf("kustomize deploy/%s: %v", dir, err)
	}
	objs, err := k8stest.DecodeManifests(bytes.NewReader(y))
	if err != nil {
		tb.Fatalf("kustomize deploy/%s: %v", dir, err)
	}
	return objs
}

// find returns the one object of kind/namespace/name in objs, or nil.
func find(objs []*unstructured.Unstructured, kind, namespace, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == namespace && o.GetName() == name {
			return o
		}
	}
	return nil
}

// mustFind is find that fails tb when the object is missing.
func mustFind(tb testing.TB, objs []*unstructured.Unstructured, kind, namespace, name string) *unstructured.Unstructured {
	tb.Helper()
	o := find(objs, kind, namespace, name)
	if o == nil {
		tb.Fatalf("no %s %s/%s among the rendered objects", kind, namespace, name)
	}
	return o
}
