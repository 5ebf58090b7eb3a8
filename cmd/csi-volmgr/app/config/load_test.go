package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

const header = "apiVersion: config.csi-volmgr.io/v1alpha1\nkind: CSIVolmgrConfiguration\n"

// TestDecodeKeepsDefaults: a file that sets some fields keeps the defaults
// of the others, nested ones (logging) included.
func TestDecodeKeepsDefaults(t *testing.T) {
	c, err := Decode([]byte(header + "resyncPeriod: 90s\nlogging:\n  verbosity: 4\nnodeLabels:\n  type: virtual-kubelet\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Defaults()
	want.ResyncPeriod.Duration = 90 * time.Second
	want.Logging.Verbosity = 4
	want.NodeLabels = map[string]string{"type": "virtual-kubelet"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Decode = %+v, want %+v", c, want)
	}
}

// TestDecodeReplacesLists: a list or map of the file replaces the
// default's whole, element by element too (a taint without a value gets
// none, not the default taint's).
func TestDecodeReplacesLists(t *testing.T) {
	c, err := Decode([]byte(header + "nodeTaints: [{key: k, effect: NoExecute}]\nnodeLabels: {a: b}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoExecute}}; !reflect.DeepEqual(c.NodeTaints, want) {
		t.Errorf("nodeTaints %v, want %v", c.NodeTaints, want)
	}
	if want := map[string]string{"a": "b"}; !reflect.DeepEqual(c.NodeLabels, want) {
		t.Errorf("nodeLabels %v, want %v", c.NodeLabels, want)
	}
}

// TestDecodeRoundTrip: Marshal's document decodes to what it was made of.
func TestDecodeRoundTrip(t *testing.T) {
	in := Defaults()
	in.NodeCPU, in.ExpectedDrivers, in.StatsPeriod.Duration = "8", []string{"a", "b"}, -1
	data, err := Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Decode(data)
	if err != nil {
		t.Fatalf("Decode(Marshal): %v\n%s", err, data)
	}
	if !reflect.DeepEqual(out, in) {
		t.Errorf("Decode(Marshal(c)) = %+v, want %+v", out, in)
	}
}

// TestDecodeErrorsNameTheField: an unknown, misspelt or repeated field, or
// a value of the wrong type, is an error naming the field; a document of
// another kind or version is refused.
func TestDecodeErrorsNameTheField(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown field":       {header + "rootDir: /x\nfrobnicate: true\n", `field frobnicate: unknown field "frobnicate"`},
		"wrong case":          {header + "RootDir: /x\n", `unknown field "RootDir"`},
		"flag name":           {header + "root-dir: /x\n", `unknown field "root-dir"`},
		"unknown nested":      {header + "logging:\n  formatt: json\n", `unknown field "logging.formatt"`},
		"repeated field":      {header + "rootDir: /x\nrootDir: /y\n", `"rootDir"`},
		"bad duration":        {header + "resyncPeriod: soon\n", `field resyncPeriod: time: invalid duration "soon"`},
		"duration as number":  {header + "csiTimeout: 5\n", "field csiTimeout:"},
		"bad int":             {header + "kubeAPIBurst: many\n", "field kubeAPIBurst:"},
		"bad list":            {header + "expectedDrivers: a,b\n", "field expectedDrivers:"},
		"bad taint":           {header + "nodeTaints:\n- key: k\n  effect: NoSchedule\n  tolerate: 1\n", `unknown field "nodeTaints[0].tolerate"`},
		"bad logging value":   {header + "logging:\n  verbosity: loud\n", "field logging:"},
		"no kind":             {"apiVersion: config.csi-volmgr.io/v1alpha1\nrootDir: /x\n", `kind ""`},
		"other version":       {strings.Replace(header, "v1alpha1", "v1", 1), `apiVersion "config.csi-volmgr.io/v1"`},
		"kubelet's kind":      {"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n", "KubeletConfiguration"},
		"not an object":       {"- a\n- b\n", "not a YAML or JSON object"},
		"empty":               {"", "not a YAML or JSON object"},
		"not YAML":            {header + "rootDir: [\n", "yaml"},
		"explicit null kinds": {"apiVersion: null\nkind: null\n", `apiVersion ""`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestLoadNamesTheFile: the error of a file names it.
func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(header+"frobnicate: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "frobnicate") {
		t.Errorf("Load = %v, want an error naming %s and frobnicate", err, path)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}
