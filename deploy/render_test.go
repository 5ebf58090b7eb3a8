package deploy_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

// kubectl returns the path of the kubectl that `make k8s-bins` builds next to
// kube-apiserver: $KUBEBUILDER_ASSETS/kubectl, else <repo>/bin/k8s/kubectl.
func kubectl(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv(k8stest.AssetsEnv)
	if dir == "" {
		dir = filepath.Join(repoRoot(tb), "bin", "k8s")
	}
	path := filepath.Join(dir, "kubectl")
	if _, err := os.Stat(path); err != nil {
		tb.Fatalf("kubectl not found (run \"make k8s-bins\"): %v", err)
	}
	return path
}

// repoRoot is the directory above this package's (deploy/..).
func repoRoot(tb testing.TB) string {
	tb.Helper()
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	return filepath.Dir(wd)
}

// componentKind matches the kind of a kustomize Component.
var componentKind = regexp.MustCompile(`(?m)^kind:\s*Component\s*$`)

// kustomizations returns every directory under deploy/ that holds a
// kustomization.yaml that is not a Component, relative to deploy/, e.g.
// "base", "kind/example".
func kustomizations(tb testing.TB) []string {
	tb.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			// A Component renders only as part of a kustomization.
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !componentKind.Match(data) {
				dirs = append(dirs, filepath.Dir(path))
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	slices.Sort(dirs)
	if len(dirs) == 0 {
		tb.Fatal("no kustomization.yaml under deploy/")
	}
	return dirs
}

// render runs `kubectl kustomize dir` and decodes its output.
func render(tb testing.TB, dir string) []*unstructured.Unstructured {
	tb.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(tb.Context(), kubectl(tb), "kustomize", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	objs, err := k8stest.DecodeManifests(&stdout)
	if err != nil {
		tb.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	if len(objs) == 0 {
		tb.Fatalf("kubectl kustomize %s rendered no object", dir)
	}
	return objs
}

// find returns the one object of kind/namespace/name in objs.
func find(tb testing.TB, objs []*unstructured.Unstructured, kind, namespace, name string) *unstructured.Unstructured {
	tb.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == namespace && o.GetName() == name {
			return o
		}
	}
	tb.Fatalf("no %s %s/%s in the rendered manifests", kind, namespace, name)
	return nil
}

// ofKind converts every object of kind in objs to T.
func ofKind[T any](tb testing.TB, objs []*unstructured.Unstructured, kind string) []*T {
	tb.Helper()
	var out []*T
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		out = append(out, convert[T](tb, o))
	}
	return out
}

// convert turns u into a typed object (k8stest.Convert).
func convert[T any](tb testing.TB, u *unstructured.Unstructured) *T {
	tb.Helper()
	return k8stest.Convert[T](tb, u)
}
