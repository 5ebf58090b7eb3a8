package app

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/csi-volmgr/csi-volmgr/volumemanager/csrapprover"
)

func TestApproveFlags(t *testing.T) {
	o := newApproveOptions()
	fs := pflag.NewFlagSet("approve-node-csrs", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := o.validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if !slices.Equal(o.rules.AgentServiceAccounts, []string{csrapprover.DefaultAgentServiceAccount}) ||
		o.rules.NodeNamePrefix != csrapprover.DefaultNodeNamePrefix || o.rules.BootstrapGroupPrefix != csrapprover.DefaultBootstrapGroupPrefix {
		t.Errorf("defaults: %+v", o.rules)
	}
	if err := fs.Parse([]string{"--agent-service-account=a/agent", "--agent-service-account=b/agent", "--node-name-prefix=vn-",
		"--bootstrap-group-prefix=", "--workers=3", "--logging-format=json", "--v=4"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.rules.AgentServiceAccounts, []string{"a/agent", "b/agent"}) {
		t.Errorf("--agent-service-account twice: %q, want both and not the default", o.rules.AgentServiceAccounts)
	}
	if o.rules.NodeNamePrefix != "vn-" || o.rules.BootstrapGroupPrefix != "" || o.workers != 3 || o.logging.Format != "json" || o.logging.Verbosity != 4 {
		t.Errorf("parsed %+v, workers %d, logging %+v", o.rules, o.workers, o.logging)
	}
	if err := o.validate(); err != nil {
		t.Errorf("valid flags: %v", err)
	}
}

// TestApproveRefusesBadFlags: a mistake is refused before the API server
// is asked, naming what is wrong.
func TestApproveRefusesBadFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--workers=0"}, "--workers"},
		{[]string{"--node-name-prefix="}, "node name prefix"},
		{[]string{"--agent-service-account=csi-volmgr"}, `agent ServiceAccount "csi-volmgr"`},
		{[]string{"--bootstrap-group-prefix=system:bootstrappers:"}, "bootstrap group prefix"},
		{[]string{"--kubeconfig=" + missing}, "--kubeconfig " + missing},
	} {
		resetLogging(t)
		cmd := NewRootCommand(io.Discard)
		cmd.SetArgs(append([]string{"approve-node-csrs"}, tc.args...))
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// resetLogging undoes an earlier test's logging configuration, which
// component-base applies once per process, so that a command's own is
// applied again (go test -count=N runs the tests again in one process).
func resetLogging(t *testing.T) {
	t.Helper()
	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		t.Fatal(err)
	}
	if err := logsapi.ResetForTest(fg); err != nil {
		t.Fatal(err)
	}
}

func TestApproveHealth(t *testing.T) {
	var running atomic.Bool
	h := healthHandler(running.Load)
	get := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/healthz", nil))
		return rec.Code
	}
	if code := get(); code != http.StatusServiceUnavailable {
		t.Errorf("before running: %d, want 503", code)
	}
	running.Store(true)
	if code := get(); code != http.StatusOK {
		t.Errorf("running: %d, want 200", code)
	}
	stop, err := serveHealth(t.Context(), "127.0.0.1:0", running.Load)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := serveHealth(t.Context(), "no-such-host:x", running.Load); err == nil || !strings.Contains(err.Error(), "--health-endpoint") {
		t.Errorf("bad address: %v", err)
	}
}
