package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestReferencesAreCurrent fails when a file of docs/reference differs
// from what the code generates now: a flag, metric, endpoint or reason was
// added or changed without `make docs`.
func TestReferencesAreCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	files, err := generate(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "docs", "reference")
	for _, name := range sortedKeys(files) {
		have, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("docs/reference/%s: %v; run make docs", name, err)
			continue
		}
		if !bytes.Equal(have, files[name]) {
			t.Errorf("docs/reference/%s is stale: run make docs and commit it\n%s", name, firstDifference(have, files[name]))
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if _, ok := files[e.Name()]; !ok {
			t.Errorf("docs/reference/%s is not generated: remove it, or generate it", e.Name())
		}
	}
}

// firstDifference shows the first line where have and want differ.
func firstDifference(have, want []byte) string {
	h, w := bytes.Split(have, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := 0; i < len(h) || i < len(w); i++ {
		var hl, wl []byte
		if i < len(h) {
			hl = h[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if !bytes.Equal(hl, wl) {
			return fmt.Sprintf("line %d:\n  checked in: %s\n  generated:  %s", i+1, hl, wl)
		}
	}
	return ""
}

// TestOperationsGuideExplainsEveryReason: docs/operations.md, the
// operator's troubleshooting page, names every condition reason, Event
// reason, state and mount-check word the code defines (the messages of
// lifecycle/runtimepods are explained by their state, AwaitingRuntime).
func TestOperationsGuideExplainsEveryReason(t *testing.T) {
	root := filepath.Join("..", "..")
	consts, err := readReasonConsts(root)
	if err != nil {
		t.Fatal(err)
	}
	guide, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range consts {
		if c.pkg == "lifecycle/runtimepods" {
			continue
		}
		if !bytes.Contains(guide, []byte("`"+c.value+"`")) {
			t.Errorf("docs/operations.md does not explain %s.%s (`%s`)", c.pkg, c.name, c.value)
		}
	}
}
