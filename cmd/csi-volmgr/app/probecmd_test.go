package app

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// TestProbeAsksTheSocket: `csi-volmgr probe` succeeds on a 200 of the check
// over the API socket and fails, with the agent's reason, otherwise.
func TestProbeAsksTheSocket(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready: node n1 does not carry the label", http.StatusServiceUnavailable)
	})
	rootDir := serveOnSocket(t, mux)
	probe := func(args ...string) error {
		root := NewRootCommand(&bytes.Buffer{})
		root.SetArgs(append([]string{"probe", "--root-dir", rootDir}, args...))
		root.SetContext(t.Context())
		return root.Execute()
	}

	if err := probe("livez"); err != nil {
		t.Errorf("probe livez on a live agent: %v", err)
	}
	if err := probe("readyz"); err == nil || !strings.Contains(err.Error(), "does not carry the label") || !strings.Contains(err.Error(), "503") {
		t.Errorf("probe readyz on an agent not ready: %v, want the code and the agent's reason", err)
	}
	if err := probe("startupz"); err == nil {
		t.Error("probe of an unknown check succeeded")
	}
	if err := probe("livez", "--socket", rootDir+"/none.sock"); err == nil {
		t.Error("probe of a missing socket succeeded")
	}
}
