package app

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

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
// report client (condition writes, Events) are made from one rest.Config
// that carries one token bucket, so that both draw from it.
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
	cfg, err := kubeConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RateLimiter == nil || cfg.RateLimiter.QPS() != 50 {
		t.Fatalf("RateLimiter = %v, want one token bucket of 50 QPS", cfg.RateLimiter)
	}
	limiter := cfg.RateLimiter
	// The burst: 100 tokens at once, then none.
	for i := range 100 {
		if !limiter.TryAccept() {
			t.Fatalf("token %d of the burst of 100 refused", i)
		}
	}
	main, err := newClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	report, err := newClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]kubernetes.Interface{"main": main, "report": report} {
		rc, ok := c.CoreV1().RESTClient().(*rest.RESTClient)
		if !ok {
			t.Fatalf("%s: RESTClient is %T", name, c.CoreV1().RESTClient())
		}
		if rc.GetRateLimiter() != limiter {
			t.Errorf("%s client has a rate limiter of its own, want the shared one", name)
		}
	}

	o.KubeAPIQPS = 0
	if cfg, err = kubeConfig(o); err != nil {
		t.Fatal(err)
	}
	if cfg.RateLimiter != nil {
		t.Errorf("--kube-api-qps=0: RateLimiter = %v, want none", cfg.RateLimiter)
	}
}
