package app

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app/config"
	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// TestSettledObjectResyncDefault: the flag's default is the library's, and
// 0 on the command line (watch every object) reaches the library as a
// negative period, since the library's 0 means its default.
func TestSettledObjectResyncDefault(t *testing.T) {
	def := config.Defaults().SettledObjectResync.Duration
	if def != volumemanager.DefaultSettledObjectResync {
		t.Errorf("--settled-object-resync defaults to %v, the library to %v", def, volumemanager.DefaultSettledObjectResync)
	}
	for flag, want := range map[time.Duration]time.Duration{def: def, 5 * time.Minute: 5 * time.Minute, 0: -1} {
		if got := settledObjectResync(flag); got != want {
			t.Errorf("settledObjectResync(%v) = %v, want %v", flag, got, want)
		}
	}
}

// TestFlagErrorsNameTheFlag checks that every Config field the volume
// manager rejects comes back naming the flag a user sets.
func TestFlagErrorsNameTheFlag(t *testing.T) {
	err := errors.Join(
		&volumemanager.ConfigError{Field: "RootDir", Err: errors.New(`"relative" must be an absolute path`)},
		&volumemanager.ConfigError{Field: "FrontDriver", Err: errors.New("is set without a front endpoint")},
		errors.New("something else"),
	)
	want := "--root-dir \"relative\" must be an absolute path\n--front-driver is set without a front endpoint\nsomething else"
	if got := (&RunOptions{}).flagErrors(err).Error(); got != want {
		t.Errorf("flagErrors = %q, want %q", got, want)
	}
	single := &volumemanager.ConfigError{Field: "HTTPEndpoint", Err: errors.New("127.0.0.1:9809: address already in use")}
	if got := (&RunOptions{}).flagErrors(single).Error(); got != "--http-endpoint 127.0.0.1:9809: address already in use" {
		t.Errorf("flagErrors(single) = %q", got)
	}
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	NewRunOptions().AddFlags(fs)
	for field, flag := range flagOf {
		if fs.Lookup(strings.TrimPrefix(flag, "--")) == nil {
			t.Errorf("field %s maps to %s, which is not a flag of run", field, flag)
		}
	}
}

// TestOneBudgetForBothClients checks that --kube-api-qps and
// --kube-api-burst are the agent's whole budget: the main client and the
// report client (condition writes, Events) draw from one token bucket,
// each through its lane of volumemanager/apibudget; the auth client
// (TokenReviews, SubjectAccessReviews) has a bucket of its own.
func TestOneBudgetForBothClients(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o := NewRunOptions()
	o.Kubeconfig, o.KubeAPIQPS, o.KubeAPIBurst = kubeconfig, 50, 100
	mainConfig, reportConfig, authConfig, err := clientConfigs(t.Context(), o, "n")
	if err != nil {
		t.Fatal(err)
	}
	limiters := map[string]flowcontrol.RateLimiter{}
	for name, cfg := range map[string]*rest.Config{"main": mainConfig, "report": reportConfig, "auth": authConfig} {
		c, err := newClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rc, ok := c.CoreV1().RESTClient().(*rest.RESTClient)
		if !ok {
			t.Fatalf("%s: RESTClient is %T", name, c.CoreV1().RESTClient())
		}
		if l := rc.GetRateLimiter(); l == nil || l.QPS() != 50 {
			t.Fatalf("%s client's rate limiter = %v, want a token bucket of 50 QPS", name, l)
		}
		limiters[name] = rc.GetRateLimiter()
	}
	// The burst: 100 tokens at once, shared, then none for either client.
	for i := range 100 {
		name := "main"
		if i%2 == 1 {
			name = "report"
		}
		if !limiters[name].TryAccept() {
			t.Fatalf("token %d of the burst of 100 refused (%s client)", i, name)
		}
	}
	for _, name := range []string{"main", "report"} {
		if limiters[name].TryAccept() {
			t.Errorf("%s client got a token after the shared burst of 100: the clients do not share one bucket", name)
		}
	}
	// The reviews of the TCP endpoint's callers have a bucket of their
	// own: its burst is whole after the others' is spent, and spending it
	// takes nothing from theirs.
	for i := range 100 {
		if !limiters["auth"].TryAccept() {
			t.Fatalf("auth client: token %d of its own burst of 100 refused", i)
		}
	}
	if limiters["auth"].TryAccept() {
		t.Error("auth client got a token after its burst of 100")
	}

	o.KubeAPIQPS = 0
	if mainConfig, reportConfig, authConfig, err = clientConfigs(t.Context(), o, "n"); err != nil {
		t.Fatal(err)
	}
	if mainConfig.RateLimiter != nil || reportConfig.RateLimiter != nil || authConfig.RateLimiter != nil {
		t.Errorf("--kube-api-qps=0: rate limiters %v, %v and %v, want none", mainConfig.RateLimiter, reportConfig.RateLimiter, authConfig.RateLimiter)
	}
}
