package app

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
)

// sampleValue is a value of flag f other than its default.
func sampleValue(f *pflag.Flag) string {
	switch f.Name {
	case "logging-format":
		return "json"
	case "node-taints":
		return "example.com/t=v:NoSchedule"
	case "vmodule":
		return "reconciler=5"
	case "log-text-info-buffer-size", "log-json-info-buffer-size":
		return "4Ki"
	}
	switch f.Value.Type() {
	case "bool":
		if f.DefValue == "true" {
			return "false"
		}
		return "true"
	case "duration":
		return "17s"
	case "int", "float32", "Level", "int32":
		return "17"
	case "stringSlice":
		return "a.example.com,b.example.com"
	case "mapStringString":
		return "example.com/k=v"
	}
	return "/sample"
}

// leaves flattens a decoded YAML document into dotted paths.
func leaves(prefix string, v any, out map[string]any) {
	if m, ok := v.(map[string]any); ok && len(m) > 0 {
		for k, e := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			leaves(p, e, out)
		}
		return
	}
	out[prefix] = v
}

func documentLeaves(t *testing.T, c *config.CSIVolmgrConfiguration) map[string]any {
	t.Helper()
	data, err := config.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	leaves("", doc, out)
	return out
}

// TestEveryFlagHasAConfigField walks run's flags: every flag but --config
// has a field of the configuration file (configField), and setting the
// flag changes that field of the document and nothing else, so that the
// flag and the field are one setting.
func TestEveryFlagHasAConfigField(t *testing.T) {
	defaults := documentLeaves(t, config.Defaults())
	fs := newRunCommand().Flags()
	seen := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" {
			return
		}
		seen[f.Name] = true
		field, ok := configField[f.Name]
		if !ok {
			t.Errorf("--%s has no field in the configuration file (configField)", f.Name)
			return
		}
		o := NewRunOptions()
		one := pflag.NewFlagSet("run", pflag.ContinueOnError)
		o.AddFlags(one)
		if err := one.Set(f.Name, sampleValue(f)); err != nil {
			t.Errorf("--%s=%s: %v", f.Name, sampleValue(f), err)
			return
		}
		got := documentLeaves(t, o.CSIVolmgrConfiguration)
		var changed []string
		for _, p := range slices.Sorted(maps.Keys(got)) {
			if d, ok := defaults[p]; !ok || !reflect.DeepEqual(d, got[p]) {
				changed = append(changed, p)
			}
		}
		for p := range defaults {
			if _, ok := got[p]; !ok {
				changed = append(changed, p)
			}
		}
		if len(changed) == 0 || slices.ContainsFunc(changed, func(p string) bool { return p != field && !strings.HasPrefix(p, field+".") }) {
			t.Errorf("--%s changes the fields %v of the document, want %s alone", f.Name, changed, field)
		}
	})
	for flag := range configField {
		if !seen[flag] {
			t.Errorf("configField names --%s, which run does not have", flag)
		}
	}
	// Every field of the file but the logging options (component-base
	// omits those at their defaults) is printed by print-defaults.
	for flag, field := range configField {
		if _, ok := defaults[field]; !ok && !strings.HasPrefix(field, "logging.") {
			t.Errorf("print-defaults lacks %s (--%s)", field, flag)
		}
	}
}

func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: config.csi-volmgr.io/v1alpha1\nkind: CSIVolmgrConfiguration\n"+doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// parseRun parses args as run does and loads --config under them.
func parseRun(t *testing.T, args ...string) (*RunOptions, error) {
	t.Helper()
	o := NewRunOptions()
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if o.ConfigFile == "" {
		return o, nil
	}
	return o, o.overrideWithFlags(fs)
}

// TestFlagsOverrideTheFile: a flag given on the command line wins over
// the file's field; a flag not given (even one whose default differs from
// the file) leaves the file's value; a field the file leaves out keeps its
// default.
func TestFlagsOverrideTheFile(t *testing.T) {
	path := writeConfig(t, `
rootDir: /from/file
resyncPeriod: 1m
registerNode: true
nodePods: 20
nodeLabels: {pool: file, zone: a}
nodeTaints: [{key: from-file, effect: NoSchedule}]
expectedDrivers: [file.example.com]
logging: {verbosity: 3, format: json}
`)
	o, err := parseRun(t, "--config", path, "--root-dir=/from/flag", "--node-labels=pool=flag", "-v=5",
		"--expected-drivers=flag.example.com", "--node-taints=from-flag=x:NoExecute", "--kube-api-qps=7")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ got, want any }{
		"rootDir (flag)":             {o.RootDir, "/from/flag"},
		"resyncPeriod (file)":        {o.ResyncPeriod.Duration, time.Minute},
		"registerNode (file)":        {o.RegisterNode, true},
		"nodePods (file)":            {o.NodePods, 20},
		"nodeLabels (flag)":          {o.NodeLabels, map[string]string{"pool": "flag"}},
		"nodeTaints (flag)":          {o.NodeTaints, []corev1.Taint{{Key: "from-flag", Value: "x", Effect: corev1.TaintEffectNoExecute}}},
		"expectedDrivers (flag)":     {o.ExpectedDrivers, []string{"flag.example.com"}},
		"logging.verbosity (flag)":   {int(o.Logging.Verbosity), 5},
		"logging.format (file)":      {o.Logging.Format, "json"},
		"kubeAPIQPS (flag)":          {o.KubeAPIQPS, float32(7)},
		"csiTimeout (default)":       {o.CSITimeout, config.Defaults().CSITimeout},
		"statsConcurrency (default)": {o.StatsConcurrency, 4},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", name, tc.got, tc.want)
		}
	}

	// Without flags, the file's values.
	o, err = parseRun(t, "--config", path)
	if err != nil {
		t.Fatal(err)
	}
	if o.RootDir != "/from/file" || !reflect.DeepEqual(o.NodeTaints, []corev1.Taint{{Key: "from-file", Effect: corev1.TaintEffectNoSchedule}}) {
		t.Errorf("without flags: rootDir %q, nodeTaints %v, want the file's", o.RootDir, o.NodeTaints)
	}
}

// TestConfigFileErrorsNameTheField: an unknown field and an invalid value
// of the file are errors naming the field; a value only the volume manager
// can judge (a taint's effect) is named by the file's field and its flag.
func TestConfigFileErrorsNameTheField(t *testing.T) {
	if _, err := parseRun(t, "--config", writeConfig(t, "rootDir: /x\nnodeTaint: []\n")); err == nil || !strings.Contains(err.Error(), `unknown field "nodeTaint"`) {
		t.Errorf("unknown field: %v", err)
	}
	if _, err := parseRun(t, "--config", writeConfig(t, "statsPeriod: often\n")); err == nil || !strings.Contains(err.Error(), "field statsPeriod") {
		t.Errorf("invalid duration: %v", err)
	}
	if _, err := parseRun(t, "--config", filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing --config file was accepted")
	}

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ doc, want string }{
		"taint effect": {
			doc:  "registerNode: true\nnodeTaints: [{key: k, effect: Sometimes}]\n",
			want: `nodeTaints (--node-taints) "k:Sometimes": effect "Sometimes"`,
		},
		"relative root": {doc: "rootDir: relative\n", want: `rootDir (--root-dir) "relative" must be an absolute path`},
		"labels without registerNode": {
			doc: "nodeLabels: {a: b}\n", want: "nodeLabels (--node-labels) needs RegisterNode",
		},
		"cpu without registerNode": {doc: "nodeCPU: \"2\"\n", want: "--node-cpu needs --register-node"},
		"bad memory":               {doc: "registerNode: true\nnodeMemory: lots\n", want: `--node-memory "lots"`},
	} {
		t.Run(name, func(t *testing.T) {
			doc := fmt.Sprintf("kubeconfig: %s\n%s", kubeconfig, tc.doc)
			if !strings.Contains(tc.doc, "rootDir:") {
				doc += "rootDir: " + t.TempDir() + "\n"
			}
			o, err := parseRun(t, "--config", writeConfig(t, doc))
			if err != nil {
				t.Fatal(err)
			}
			if err := run(t.Context(), o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestPrintDefaultsRoundTrip: `csi-volmgr config print-defaults` prints a
// document that --config takes unchanged, giving the defaults, and that
// prints the same again.
func TestPrintDefaultsRoundTrip(t *testing.T) {
	var out bytes.Buffer
	root := NewRootCommand(&out)
	root.SetArgs([]string{"config", "print-defaults"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseRun(t, "--config", path)
	if err != nil {
		t.Fatalf("--config of print-defaults' output: %v\n%s", err, out.String())
	}
	if !reflect.DeepEqual(o.CSIVolmgrConfiguration, config.Defaults()) {
		t.Errorf("--config of print-defaults = %+v, want the defaults %+v", o.CSIVolmgrConfiguration, config.Defaults())
	}
	again, err := config.Marshal(o.CSIVolmgrConfiguration)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, out.Bytes()) {
		t.Errorf("printed again:\n%s\nwant:\n%s", again, out.String())
	}
}
