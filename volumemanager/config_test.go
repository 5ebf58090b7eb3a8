package volumemanager

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

func TestConfigValidate(t *testing.T) {
	valid := func() Config {
		return Config{NodeName: "n", RootDir: "/var/lib/csi-volmgr", KubeClient: fake.NewClientset()}
	}
	for name, tc := range map[string]struct {
		mutate    func(*Config)
		wantField string
		wantText  string
	}{
		"valid":                     {mutate: func(*Config) {}},
		"front endpoint and driver": {mutate: func(c *Config) { c.FrontEndpoint, c.FrontDriver = "/run/front.sock", "d" }},
		"front unix URL":            {mutate: func(c *Config) { c.FrontEndpoint, c.FrontDriver = "unix:///run/front.sock", "d" }},
		"no node name":              {mutate: func(c *Config) { c.NodeName = "" }, wantField: "NodeName", wantText: "is required"},
		"relative root":             {mutate: func(c *Config) { c.RootDir = "relative" }, wantField: "RootDir", wantText: `"relative" must be an absolute path`},
		"relative registration dir": {mutate: func(c *Config) { c.RegistrationDir = "reg" }, wantField: "RegistrationDir", wantText: "absolute"},
		"registration dir is root":  {mutate: func(c *Config) { c.RegistrationDir = c.RootDir + "/" }, wantField: "RegistrationDir", wantText: "API socket"},
		"front endpoint only":       {mutate: func(c *Config) { c.FrontEndpoint = "/run/front.sock" }, wantField: "FrontEndpoint", wantText: "without a front driver"},
		"front driver only":         {mutate: func(c *Config) { c.FrontDriver = "d" }, wantField: "FrontDriver", wantText: "without a front endpoint"},
		"relative front endpoint":   {mutate: func(c *Config) { c.FrontEndpoint, c.FrontDriver = "front.sock", "d" }, wantField: "FrontEndpoint"},
		"tcp front endpoint":        {mutate: func(c *Config) { c.FrontEndpoint, c.FrontDriver = "tcp://127.0.0.1:10000", "d" }, wantField: "FrontEndpoint"},
		"bad HTTP endpoint":         {mutate: func(c *Config) { c.HTTPEndpoint = "9809" }, wantField: "HTTPEndpoint"},
		"plaintext on loopback":     {mutate: func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.Plaintext = "127.0.0.1:9809", true }},
		"plaintext on localhost":    {mutate: func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.Plaintext = "localhost:9809", true }},
		"plaintext on ::1":          {mutate: func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.Plaintext = "[::1]:9809", true }},
		"plaintext on every interface": {
			mutate:    func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.Plaintext = ":9809", true },
			wantField: "HTTPAccess.Plaintext", wantText: `only allowed on a loopback endpoint (127.0.0.1, ::1 or localhost), and ":9809" is reachable`,
		},
		"plaintext on a pod IP": {
			mutate:    func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.Plaintext = "10.0.0.7:9809", true },
			wantField: "HTTPAccess.Plaintext", wantText: "always serves TLS",
		},
		"plaintext with a certificate": {
			mutate: func(c *Config) {
				c.HTTPEndpoint, c.HTTPAccess.Plaintext, c.HTTPAccess.CertFile, c.HTTPAccess.KeyFile = "127.0.0.1:9809", true, "/c", "/k"
			},
			wantField: "HTTPAccess.Plaintext", wantText: "which are for TLS",
		},
		"certificate without key": {
			mutate:    func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.CertFile = ":9809", "/c" },
			wantField: "HTTPAccess.KeyFile", wantText: `is required with the certificate "/c"`,
		},
		"key without certificate": {
			mutate:    func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.KeyFile = ":9809", "/k" },
			wantField: "HTTPAccess.CertFile", wantText: "is required",
		},
		"TLS 1.1": {
			mutate:    func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.MinVersion = ":9809", 0x0302 },
			wantField: "HTTPAccess.MinVersion", wantText: "TLS 1.1 is below TLS 1.2",
		},
		"negative cache TTL": {
			mutate:    func(c *Config) { c.HTTPEndpoint, c.HTTPAccess.DenyCacheTTL = ":9809", -1 },
			wantField: "HTTPAccess.DenyCacheTTL", wantText: "must not be negative",
		},
		"client CA in standalone mode": {
			mutate: func(c *Config) {
				c.KubeClient, c.Manifests, c.HTTPEndpoint, c.HTTPAccess.ClientCAFile = nil, "/etc/csi-volmgr", ":9809", "/ca"
			},
			wantField: "HTTPAccess.ClientCAFile", wantText: "needs an API server",
		},
		"negative CSI timeout": {mutate: func(c *Config) { c.CSITimeout = -1 }, wantField: "CSITimeout", wantText: "must not be negative"},
		"report client in standalone mode": {
			mutate: func(c *Config) {
				c.KubeClient, c.Manifests, c.ReportClient = nil, "/etc/csi-volmgr", fake.NewClientset()
			},
			wantField: "ReportClient", wantText: "needs KubeClient",
		},
		"auth client in standalone mode": {
			mutate: func(c *Config) {
				c.KubeClient, c.Manifests, c.AuthClient = nil, "/etc/csi-volmgr", fake.NewClientset()
			},
			wantField: "AuthClient", wantText: "needs KubeClient",
		},
		"auth client":                   {mutate: func(c *Config) { c.AuthClient = fake.NewClientset() }},
		"negative HTTP max connections": {mutate: func(c *Config) { c.HTTPMaxConnections = -1 }, wantField: "HTTPMaxConnections", wantText: "must not be negative"},
		"node identity":                 {mutate: func(c *Config) { c.NodeIdentity = true }},
		"node identity with cluster-wide informers": {
			mutate:    func(c *Config) { c.NodeIdentity, c.ClusterWideInformers = true, true },
			wantField: "ClusterWideInformers", wantText: "list no claims",
		},
		"node identity watching every object": {
			mutate:    func(c *Config) { c.NodeIdentity, c.SettledObjectResync = true, -1 },
			wantField: "SettledObjectResync", wantText: "must be positive",
		},
		"node identity in standalone mode": {
			mutate:    func(c *Config) { c.KubeClient, c.Manifests, c.NodeIdentity = nil, "/etc/csi-volmgr", true },
			wantField: "NodeIdentity", wantText: "needs an API server",
		},
		"manifests with node registration": {
			mutate:    func(c *Config) { c.KubeClient, c.Manifests, c.RegisterNode = nil, "/etc/csi-volmgr", true },
			wantField: "Manifests", wantText: "without an API server",
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			err := c.validate()
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("validate = %v, want nil", err)
				}
				return
			}
			ce, ok := errors.AsType[*ConfigError](err)
			if !ok || ce.Field != tc.wantField || !strings.Contains(ce.Err.Error(), tc.wantText) {
				t.Errorf("validate = %v, want a ConfigError of %s saying %q", err, tc.wantField, tc.wantText)
			}
		})
	}
}

func TestConfigValidateDefaults(t *testing.T) {
	c := Config{NodeName: "n", RootDir: "/r", KubeClient: fake.NewClientset(), RegisterNode: true}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.RegistrationDir != "/r/plugins_registry" || !c.RemoveTerminatingPods {
		t.Errorf("defaults: registration dir %q, remove terminating pods %v; want /r/plugins_registry and true", c.RegistrationDir, c.RemoveTerminatingPods)
	}
}
