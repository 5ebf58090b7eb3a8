package driverresult

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func valid(name string) Result {
	return Result{
		Name: name, Driver: "csi.example.com", Kind: "fuse", Module: "example.com/d", Version: "v1.0.0",
		Commit: "abc", Date: "2026-11-28T18:00:00Z", Machine: "2 cores",
		Checks:          []Step{{Name: "publish-parallel", Result: Pass, Seconds: 1}, {Name: "block-two-pods", Result: Skip, Reason: "filesystem only"}},
		Lifecycle:       []Step{{Name: "teardown", Result: Fail, Reason: "left mounted", Seconds: 2}},
		NodePluginFlags: []string{"--endpoint=x"},
		Settings:        []string{"kubeletDir: /var/lib/csi-volmgr"},
		Seconds:         3,
	}
}

// TestWriteLoad: what Write stores, Load reads back, sorted by name, and nothing else is left in
// the directory.
func TestWriteLoad(t *testing.T) {
	dir := t.TempDir()
	b, a := valid("b"), valid("a")
	for _, r := range []Result{b, a} {
		if err := Write(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []Result{a, b}) {
		t.Errorf("Load = %+v\nwant %+v", got, []Result{a, b})
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("directory holds %d entries, want a.json and b.json only", len(entries))
	}
	if p, f, s := Counts(a.Checks); p != 1 || f != 0 || s != 1 {
		t.Errorf("Counts = %d %d %d", p, f, s)
	}
}

// TestValidateRefuses: a fail or skip without its reason, an unknown outcome, a record without its
// identity are refused by Validate and so by Write, and a file with an unknown field by Load.
func TestValidateRefuses(t *testing.T) {
	for name, mutate := range map[string]func(*Result){
		"skip without reason": func(r *Result) { r.Checks[1].Reason = " " },
		"fail without reason": func(r *Result) { r.Lifecycle[0].Reason = "" },
		"unknown outcome":     func(r *Result) { r.Checks[0].Result = "ok" },
		"no version":          func(r *Result) { r.Version = "" },
	} {
		r := valid("x")
		mutate(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("%s: Validate accepted it", name)
		}
		dir := t.TempDir()
		if err := Write(dir, r); err == nil {
			t.Errorf("%s: Write accepted it", name)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s: Write left %d files", name, len(entries))
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.json"), []byte(`{"name":"x","surprise":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "surprise") {
		t.Errorf("Load of an unknown field: %v", err)
	}
}
