package app

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// fakeAgent answers VolumesPath with one volume and records the
// Authorization header of each request.
type fakeAgent struct {
	mu    sync.Mutex
	auths []string
}

func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.auths = append(f.auths, r.Header.Get("Authorization"))
	f.mu.Unlock()
	if r.URL.Path != volumemanager.VolumesPath {
		http.NotFound(w, r)
		return
	}
	_ = json.NewEncoder(w).Encode([]volumemanager.VolumeStatus{{Name: "v1", Driver: "d", State: "Staged", Pods: []volumemanager.PodStatus{}}})
}

func (f *fakeAgent) authorizations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.auths...)
}

// serveOnSocket serves h on the API socket of a new root directory, which
// it returns; both go when t ends.
func serveOnSocket(t *testing.T, h http.Handler) (rootDir string) {
	t.Helper()
	// Not t.TempDir(): its path can exceed the unix socket path limit.
	rootDir, err := os.MkdirTemp("", "st")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(rootDir) })
	l, err := net.Listen("unix", volumemanager.SocketPath(rootDir))
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: h}}
	srv.Start()
	t.Cleanup(srv.Close)
	return rootDir
}

func runStatus(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := NewRootCommand(&out)
	root.SetArgs(append([]string{"status", "-o", "json"}, args...))
	root.SetContext(t.Context())
	err := root.Execute()
	return out.String(), err
}

// TestStatusUsesTheSocketOfRootDir: without --server the client talks to
// <root-dir>/csi-volmgr.sock, with no credentials.
func TestStatusUsesTheSocketOfRootDir(t *testing.T) {
	agent := &fakeAgent{}
	rootDir := serveOnSocket(t, agent)

	out, err := runStatus(t, "--root-dir", rootDir)
	if err != nil {
		t.Fatalf("status --root-dir %s: %v", rootDir, err)
	}
	var vols []volumemanager.VolumeStatus
	if err := json.Unmarshal([]byte(out), &vols); err != nil || len(vols) != 1 || vols[0].Name != "v1" {
		t.Errorf("status printed %q (%v), want the agent's one volume", out, err)
	}
	if got := agent.authorizations(); len(got) != 1 || got[0] != "" {
		t.Errorf("Authorization headers %q, want one request without", got)
	}

	// --socket names the socket itself; a missing one is named in the error.
	if _, err := runStatus(t, "--socket", volumemanager.SocketPath(rootDir)); err != nil {
		t.Errorf("status --socket: %v", err)
	}
	missing := filepath.Join(rootDir, "nothing.sock")
	if _, err := runStatus(t, "--socket", missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("status --socket %s = %v, want an error naming the socket", missing, err)
	}
}

// TestStatusSendsTheTokenToTheServer: with --server the token of
// --token-file (or --token) goes along as a bearer token; over plain HTTP
// to a loopback address (an agent with --http-endpoint-plaintext).
func TestStatusSendsTheTokenToTheServer(t *testing.T) {
	agent := &fakeAgent{}
	srv := httptest.NewServer(agent)
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runStatus(t, "--server", srv.URL, "--token-file", tokenFile); err != nil {
		t.Fatal(err)
	}
	if _, err := runStatus(t, "--server", srv.URL, "--token", "flag-token"); err != nil {
		t.Fatal(err)
	}
	if _, err := runStatus(t, "--server", srv.URL); err != nil {
		t.Fatal(err)
	}
	want := []string{"Bearer file-token", "Bearer flag-token", ""}
	if got := agent.authorizations(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Authorization headers %q, want %q", got, want)
	}
}

func TestStatusRejectsFlagCombinations(t *testing.T) {
	for _, args := range [][]string{
		{"--server", "127.0.0.1:1", "--socket", "/x.sock"},
		{"--server", "127.0.0.1:1", "--token", "a", "--token-file", "/t"},
		{"--token", "a"},
		{"-o", "yaml"},
		{"--certificate-authority", "/ca.crt"},
		{"--server", "http://127.0.0.1:1", "--certificate-authority", "/ca.crt"},
		{"--server", "127.0.0.1:1", "--insecure-skip-tls-verify", "--certificate-authority", "/ca.crt"},
		{"--server", "127.0.0.1:1", "--client-certificate", "/c.crt"},
	} {
		if _, err := runStatus(t, args...); err == nil {
			t.Errorf("status %v succeeded, want a usage error", args)
		}
	}
}

func TestStatusShowsPodsAwaitingTheRuntime(t *testing.T) {
	var out strings.Builder
	if err := printAwaitingRuntime(&out, []volumemanager.PodVolumes{{UID: "u0", State: volumemanager.PodVolumesReady}}); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Errorf("printed %q with no pod awaiting its runtime, want nothing", out.String())
	}
	pods := []volumemanager.PodVolumes{
		{UID: "u1", Namespace: "ns", Name: "a", State: volumemanager.PodVolumesAwaitingRuntime, Message: "the pod is no longer in the API server"},
		{UID: "u2", State: volumemanager.PodVolumesAwaitingRuntime, Message: "found on disk at start"},
		{UID: "u3", Namespace: "ns", Name: "b", State: volumemanager.PodVolumesReady},
	}
	if err := printAwaitingRuntime(&out, pods); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"ns/a", "u1", "AwaitingRuntime", "no longer in the API server", "<unknown>", "u2", "found on disk"} {
		if !strings.Contains(got, want) {
			t.Errorf("status output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "u3") {
		t.Errorf("status output lists a ready pod among those awaiting their runtime:\n%s", got)
	}
}
