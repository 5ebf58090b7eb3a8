package app

import (
	"bytes"
	"strings"
	"testing"
)

func TestVersionPrintsBuildVersion(t *testing.T) {
	old := version
	version = "v1.2.3-test"
	t.Cleanup(func() { version = old })

	var out bytes.Buffer
	cmd := NewRootCommand(&out)
	cmd.SetArgs([]string{"version"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("version: %v", err)
	}
	if got := strings.TrimSpace(out.String()); got != "v1.2.3-test" {
		t.Fatalf("version printed %q, want %q", got, "v1.2.3-test")
	}
}

func TestUnknownCommandFails(t *testing.T) {
	var out bytes.Buffer
	cmd := NewRootCommand(&out)
	cmd.SetArgs([]string{"no-such-command"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("unknown command succeeded")
	}
}
