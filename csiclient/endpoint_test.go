package csiclient_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
)

func TestParseEndpoint(t *testing.T) {
	cases := map[string]struct {
		endpoint string
		want     string // "" means an error
	}{
		"absolute path":      {"/var/lib/kubelet/plugins/hostpath.csi.k8s.io/csi.sock", "/var/lib/kubelet/plugins/hostpath.csi.k8s.io/csi.sock"},
		"unix URL":           {"unix:///csi/csi.sock", "/csi/csi.sock"},
		"unclean path":       {"unix:///csi//x/../csi.sock", "/csi/csi.sock"},
		"longest path":       {"/" + strings.Repeat("x", 106), "/" + strings.Repeat("x", 106)},
		"empty":              {"", ""},
		"bare scheme":        {"unix://", ""},
		"relative path":      {"csi.sock", ""},
		"relative unix URL":  {"unix://csi.sock", ""},
		"tcp":                {"tcp://127.0.0.1:10000", ""},
		"too long":           {"/" + strings.Repeat("x", 107), ""},
		"NUL byte":           {"/csi/csi\x00.sock", ""},
		"unix URL with host": {"unix://host/csi.sock", ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := csiclient.ParseEndpoint(tc.endpoint)
			if tc.want == "" {
				if err == nil || !errors.Is(err, csiclient.ErrInvalidConfig) {
					t.Errorf("ParseEndpoint(%q) = (%q, %v), want an ErrInvalidConfig error", tc.endpoint, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ParseEndpoint(%q) = (%q, %v), want %q", tc.endpoint, got, err, tc.want)
			}
		})
	}
}

// FuzzParseEndpoint checks that every accepted endpoint is a clean absolute
// path that fits a unix socket address, and that parsing is idempotent.
func FuzzParseEndpoint(f *testing.F) {
	for _, seed := range []string{"/csi/csi.sock", "unix:///csi/csi.sock", "unix://", "csi.sock", "tcp://x:1", "/a/../../b", "unix:///\x00"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, endpoint string) {
		path, err := csiclient.ParseEndpoint(endpoint)
		if err != nil {
			if !errors.Is(err, csiclient.ErrInvalidConfig) {
				t.Fatalf("ParseEndpoint(%q) error %v does not wrap ErrInvalidConfig", endpoint, err)
			}
			return
		}
		if !filepath.IsAbs(path) || filepath.Clean(path) != path || len(path) > 107 || strings.ContainsRune(path, 0) {
			t.Fatalf("ParseEndpoint(%q) = %q, not a clean absolute socket path", endpoint, path)
		}
		if again, err := csiclient.ParseEndpoint(path); err != nil || again != path {
			t.Fatalf("ParseEndpoint(%q) = (%q, %v), want it unchanged", path, again, err)
		}
	})
}
