package registry

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func TestValidateInfo(t *testing.T) {
	good := func() *registerapi.PluginInfo {
		return &registerapi.PluginInfo{
			Type:              registerapi.CSIPlugin,
			Name:              "hostpath.csi.k8s.io",
			Endpoint:          "/var/lib/csi/hostpath/csi.sock",
			SupportedVersions: []string{"1.0.0"},
		}
	}
	tests := map[string]struct {
		mutate      func(*registerapi.PluginInfo)
		wantErr     string // substring; empty means valid
		wantVersion string
	}{
		"valid":                  {wantVersion: "1.0.0"},
		"highest 1.x wins":       {mutate: func(i *registerapi.PluginInfo) { i.SupportedVersions = []string{"0.3.0", "1.2.0", "1.10.1", "2.0.0"} }, wantVersion: "1.10.1"},
		"v prefix accepted":      {mutate: func(i *registerapi.PluginInfo) { i.SupportedVersions = []string{"v1.5.0"} }, wantVersion: "1.5.0"},
		"unix scheme accepted":   {mutate: func(i *registerapi.PluginInfo) { i.Endpoint = "unix:///run/csi.sock" }, wantVersion: "1.0.0"},
		"nil info":               {mutate: nil, wantErr: "empty GetInfo answer"},
		"device plugin":          {mutate: func(i *registerapi.PluginInfo) { i.Type = registerapi.DevicePlugin }, wantErr: `plugin type "DevicePlugin" is not "CSIPlugin"`},
		"empty type":             {mutate: func(i *registerapi.PluginInfo) { i.Type = "" }, wantErr: "is not \"CSIPlugin\""},
		"only 0.x versions":      {mutate: func(i *registerapi.PluginInfo) { i.SupportedVersions = []string{"0.3.0"} }, wantErr: "supported 1.x version"},
		"no versions":            {mutate: func(i *registerapi.PluginInfo) { i.SupportedVersions = nil }, wantErr: "no supported versions"},
		"garbage version":        {mutate: func(i *registerapi.PluginInfo) { i.SupportedVersions = []string{"one"} }, wantErr: "supported 1.x version"},
		"path traversal name":    {mutate: func(i *registerapi.PluginInfo) { i.Name = "../../etc" }, wantErr: "not a DNS-1123 subdomain"},
		"slash in name":          {mutate: func(i *registerapi.PluginInfo) { i.Name = "a/b" }, wantErr: "not a DNS-1123 subdomain"},
		"empty name":             {mutate: func(i *registerapi.PluginInfo) { i.Name = "" }, wantErr: "empty driver name"},
		"300 character name":     {mutate: func(i *registerapi.PluginInfo) { i.Name = strings.Repeat("a", 300) }, wantErr: "300 characters long, the limit is 63"},
		"upper case name":        {mutate: func(i *registerapi.PluginInfo) { i.Name = "Hostpath.CSI" }, wantErr: "not a DNS-1123 subdomain"},
		"relative endpoint":      {mutate: func(i *registerapi.PluginInfo) { i.Endpoint = "csi.sock" }, wantErr: "not an absolute path"},
		"unclean endpoint":       {mutate: func(i *registerapi.PluginInfo) { i.Endpoint = "/var/lib/../../etc/csi.sock" }, wantErr: "not a clean path"},
		"empty endpoint":         {mutate: func(i *registerapi.PluginInfo) { i.Endpoint = "" }, wantErr: "empty endpoint"},
		"endpoint over 107 byte": {mutate: func(i *registerapi.PluginInfo) { i.Endpoint = "/" + strings.Repeat("x", 120) }, wantErr: "unix socket limit"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			info := good()
			if name == "nil info" {
				info = nil
			} else if tc.mutate != nil {
				tc.mutate(info)
			}
			cand, err := ValidateInfo(info)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("ValidateInfo accepted %+v", info)
				}
				if !errors.Is(err, ErrInvalidRegistration) {
					t.Errorf("error %v does not wrap ErrInvalidRegistration", err)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %q does not say %q", err, tc.wantErr)
				}
				if len(err.Error()) > 400 {
					t.Errorf("error message is %d bytes long: hostile input must not flood logs", len(err.Error()))
				}
				return
			}
			if err != nil {
				t.Fatalf("ValidateInfo: %v", err)
			}
			if got := cand.Version.String(); got != tc.wantVersion {
				t.Errorf("version = %s, want %s", got, tc.wantVersion)
			}
			if strings.HasPrefix(cand.Endpoint, "unix://") {
				t.Errorf("endpoint %q keeps its scheme", cand.Endpoint)
			}
		})
	}
}

func TestCheckEndpoint(t *testing.T) {
	dir, err := os.MkdirTemp("", "ep")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	sock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	regular := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	if err := CheckEndpoint(sock); err != nil {
		t.Errorf("CheckEndpoint(socket) = %v", err)
	}
	if err := CheckEndpoint(regular); err == nil || !strings.Contains(err.Error(), "not a unix socket") {
		t.Errorf("CheckEndpoint(regular file) = %v, want 'not a unix socket'", err)
	}
	if err := CheckEndpoint(filepath.Join(dir, "missing.sock")); err == nil {
		t.Error("CheckEndpoint(missing) succeeded")
	}
}

// FuzzValidateInfo checks that no GetInfo answer makes validation panic and
// that whatever it accepts is safe to use as a driver name and socket path.
func FuzzValidateInfo(f *testing.F) {
	f.Add("CSIPlugin", "hostpath.csi.k8s.io", "/var/lib/csi.sock", "1.0.0")
	f.Add("CSIPlugin", "../../etc", "/a/../b", "0.3.0")
	f.Add("DevicePlugin", "x", "unix:///x", "v1.2.3")
	f.Add("CSIPlugin", strings.Repeat("a", 64), "relative", "1.0.0-alpha")
	f.Fuzz(func(t *testing.T, typ, name, endpoint, version string) {
		cand, err := ValidateInfo(&registerapi.PluginInfo{Type: typ, Name: name, Endpoint: endpoint, SupportedVersions: []string{version}})
		if err != nil {
			if !errors.Is(err, ErrInvalidRegistration) {
				t.Fatalf("error %v does not wrap ErrInvalidRegistration", err)
			}
			return
		}
		if typ != registerapi.CSIPlugin {
			t.Fatalf("accepted type %q", typ)
		}
		if len(cand.Name) == 0 || len(cand.Name) > maxDriverNameLength || strings.ContainsAny(cand.Name, "/\\") || strings.Contains(cand.Name, "..") {
			t.Fatalf("accepted unsafe driver name %q", cand.Name)
		}
		if !filepath.IsAbs(cand.Endpoint) || filepath.Clean(cand.Endpoint) != cand.Endpoint {
			t.Fatalf("accepted unsafe endpoint %q", cand.Endpoint)
		}
		if cand.Version.Major() != 1 {
			t.Fatalf("accepted version %s", cand.Version)
		}
	})
}

// FuzzGetInfoWire decodes arbitrary bytes as a GetInfo answer, as they come
// off a registration socket, and validates it: nothing panics, a malformed
// message is refused by the decoder, and what validation accepts is safe,
// as in FuzzValidateInfo, whatever the number of versions offered.
func FuzzGetInfoWire(f *testing.F) {
	for _, info := range []*registerapi.PluginInfo{
		{Type: registerapi.CSIPlugin, Name: "hostpath.csi.k8s.io", Endpoint: "/var/lib/csi.sock", SupportedVersions: []string{"1.0.0", "1.5.0", "0.3.0"}},
		{Type: registerapi.CSIPlugin, Name: "../../etc", Endpoint: "unix:///a/../b", SupportedVersions: []string{"v1", "1.x", ""}},
		{Type: registerapi.DevicePlugin, Name: strings.Repeat("a", 300), Endpoint: strings.Repeat("/a", 100)},
	} {
		data, err := proto.Marshal(info)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		info := &registerapi.PluginInfo{}
		if err := proto.Unmarshal(data, info); err != nil {
			return
		}
		cand, err := ValidateInfo(info)
		if err != nil {
			if !errors.Is(err, ErrInvalidRegistration) {
				t.Fatalf("error %v does not wrap ErrInvalidRegistration", err)
			}
			if len(err.Error()) > 4096 {
				t.Fatalf("error message of %d bytes: hostile strings must be truncated", len(err.Error()))
			}
			return
		}
		if info.Type != registerapi.CSIPlugin || len(cand.Name) == 0 || len(cand.Name) > maxDriverNameLength ||
			strings.ContainsAny(cand.Name, "/\\\x00") || strings.Contains(cand.Name, "..") {
			t.Fatalf("accepted %+v", info)
		}
		if !filepath.IsAbs(cand.Endpoint) || filepath.Clean(cand.Endpoint) != cand.Endpoint || len(cand.Endpoint) > maxUnixSocketPath {
			t.Fatalf("accepted unsafe endpoint %q", cand.Endpoint)
		}
		if cand.Version.Major() != 1 || !slices.ContainsFunc(info.SupportedVersions, func(v string) bool {
			p, err := utilversion.ParseGeneric(v)
			return err == nil && p.EqualTo(cand.Version)
		}) {
			t.Fatalf("version %s is not one of the 1.x versions offered, %q", cand.Version, info.SupportedVersions)
		}
	})
}
