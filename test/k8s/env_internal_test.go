package k8stest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestUniqueName(t *testing.T) {
	tests := map[string]struct {
		testName   string
		wantPrefix string
	}{
		"simple":          {testName: "TestInstall", wantPrefix: "testinstall-"},
		"subtest":         {testName: "TestInstall/two_drivers", wantPrefix: "testinstall-two-drivers-"},
		"punctuation":     {testName: "Test/__a..b--c__/", wantPrefix: "test-a-b-c-"},
		"only invalid":    {testName: "/__/", wantPrefix: "t-"},
		"long name":       {testName: "Test" + strings.Repeat("Abc_", 30), wantPrefix: "testabc-abc-"},
		"leading numbers": {testName: "42/x", wantPrefix: "42-x-"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := UniqueName(tc.testName)
			if msgs := validation.IsDNS1123Label(got); len(msgs) > 0 {
				t.Errorf("UniqueName(%q) = %q is not a DNS-1123 label: %v", tc.testName, got, msgs)
			}
			if msgs := validation.IsValidLabelValue(got); len(msgs) > 0 {
				t.Errorf("UniqueName(%q) = %q is not a label value: %v", tc.testName, got, msgs)
			}
			if !strings.HasPrefix(got, tc.wantPrefix) {
				t.Errorf("UniqueName(%q) = %q, want prefix %q", tc.testName, got, tc.wantPrefix)
			}
			if again := UniqueName(tc.testName); again == got {
				t.Errorf("UniqueName(%q) returned %q twice", tc.testName, got)
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRepoRoot(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "go.mod"), "module "+ModulePath+"\n\ngo 1.26.0\n")
	writeFile(t, filepath.Join(root, "test", "k8s", "tools", "go.mod"), "module "+ModulePath+"/test/k8s/tools\n")
	start := filepath.Join(root, "test", "k8s", "tools", "sub")
	if err := os.MkdirAll(start, 0o755); err != nil {
		t.Fatal(err)
	}

	got, err := repoRoot(start)
	if err != nil {
		t.Fatalf("repoRoot() error: %v", err)
	}
	if got != root {
		t.Errorf("repoRoot() = %q, want %q (the tools module's go.mod must be passed over)", got, root)
	}

	if _, err := repoRoot(t.TempDir()); err == nil || !strings.Contains(err.Error(), AssetsEnv) {
		t.Errorf("repoRoot() outside the repository = %v, want an error that suggests %s", err, AssetsEnv)
	}
}

func TestAssetsDir(t *testing.T) {
	explicit := t.TempDir()
	fromEnv := t.TempDir()
	t.Setenv(AssetsEnv, fromEnv)

	if got, err := assetsDir(explicit); err != nil || got != explicit {
		t.Errorf("assetsDir(%q) = %q, %v; want the explicit directory", explicit, got, err)
	}
	if got, err := assetsDir(""); err != nil || got != fromEnv {
		t.Errorf("assetsDir(\"\") = %q, %v; want $%s = %q", got, err, AssetsEnv, fromEnv)
	}

	t.Setenv(AssetsEnv, "")
	got, err := assetsDir("")
	if err != nil {
		t.Fatalf("assetsDir(\"\") without %s: %v", AssetsEnv, err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// This package lives in <root>/test/k8s.
	if want := filepath.Join(filepath.Dir(filepath.Dir(wd)), "bin", "k8s"); got != want {
		t.Errorf("assetsDir(\"\") = %q, want %q", got, want)
	}
}

func TestStartWithoutBinaries(t *testing.T) {
	empty := t.TempDir()
	_, err := Start(Options{AssetsDir: empty})
	want := `kube-apiserver not found in ` + empty + `: run "make k8s-bins"`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start() = %v, want an error containing %q", err, want)
	}

	writeFile(t, filepath.Join(empty, "kube-apiserver"), "")
	_, err = Start(Options{AssetsDir: empty})
	want = `etcd not found in ` + empty + `: run "make k8s-bins"`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start() = %v, want an error containing %q", err, want)
	}
}
