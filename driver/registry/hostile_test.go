package registry_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestHostileRegistrationsDoNotBlockAGoodOne creates a directory full of bad
// registrations at the same moment as a good one. Each bad one must be
// rejected with a reason that says what is wrong (told to the registrar and
// to observers) or ignored, and the good driver must register while a
// registrar that never answers is still hanging.
func TestHostileRegistrationsDoNotBlockAGoodOne(t *testing.T) {
	regDir := shortDir(t)
	good := plugintest.Start(t, plugintest.Options{})
	regularFile := filepath.Join(shortDir(t), "file.sock")
	if err := os.WriteFile(regularFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	info := func(typ, name, endpoint string, versions ...string) *registerapi.PluginInfo {
		return &registerapi.PluginInfo{Type: typ, Name: name, Endpoint: endpoint, SupportedVersions: versions}
	}
	cases := map[string]struct {
		info    *registerapi.PluginInfo
		wantErr string
	}{
		"type.sock":     {info(registerapi.DevicePlugin, "bad-type.example.com", good.Endpoint, "1.0.0"), `plugin type "DevicePlugin" is not "CSIPlugin"`},
		"version.sock":  {info(registerapi.CSIPlugin, "old.example.com", good.Endpoint, "0.3.0"), "none of the offered versions"},
		"dotdot.sock":   {info(registerapi.CSIPlugin, "../../etc", good.Endpoint, "1.0.0"), "is not a DNS-1123 subdomain"},
		"long.sock":     {info(registerapi.CSIPlugin, strings.Repeat("a", 300), good.Endpoint, "1.0.0"), "300 characters long, the limit is 63"},
		"relative.sock": {info(registerapi.CSIPlugin, "relative.example.com", "csi/csi.sock", "1.0.0"), "is not an absolute path"},
		"regular.sock":  {info(registerapi.CSIPlugin, "regular.example.com", regularFile, "1.0.0"), "is not a unix socket"},
		"missing.sock":  {info(registerapi.CSIPlugin, "missing.example.com", filepath.Join(regDir, "nope"), "1.0.0"), "no such file or directory"},
	}

	r, evs := startRegistry(t, registry.Config{
		Dir: regDir,
		// Long enough that the silent registrar is certainly still hanging
		// when the good driver has registered.
		HandshakeTimeout: 10 * time.Minute,
	})

	// All at once, the silent ones first: more hanging registrars than a
	// worker pool would have.
	var silentAccepts []func() int
	for i := range 8 {
		silentAccepts = append(silentAccepts, serveSilent(t, filepath.Join(regDir, fmt.Sprintf("silent-%d.sock", i))))
	}
	fakes := map[string]*fakeRegistrar{}
	for sock, tc := range cases {
		fakes[sock] = &fakeRegistrar{info: tc.info}
		serveRegistrar(t, filepath.Join(regDir, sock), fakes[sock])
	}
	hidden := &fakeRegistrar{info: info(registerapi.CSIPlugin, "hidden.example.com", good.Endpoint, "1.0.0")}
	serveRegistrar(t, filepath.Join(regDir, ".hidden.sock"), hidden)
	if err := os.WriteFile(filepath.Join(regDir, "x.sock"), []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	goodReg := &fakeRegistrar{info: info(registerapi.CSIPlugin, good.Name, good.Endpoint, "1.0.0")}
	serveRegistrar(t, filepath.Join(regDir, "good.sock"), goodReg)

	eventually(t, "the good driver to register", func() bool {
		_, ok := r.Driver(good.Name)
		return ok
	})
	for i, accepted := range silentAccepts {
		if accepted() == 0 {
			t.Errorf("the registry never connected to silent registrar %d", i)
		}
	}
	eventually(t, "the good registrar to be told", func() bool { _, st := goodReg.calls(); return len(st) > 0 })
	if _, statuses := goodReg.calls(); len(statuses) != 1 || !statuses[0].PluginRegistered {
		t.Errorf("good registrar was told %v, want one PluginRegistered=true", statuses)
	}

	for sock, tc := range cases {
		eventually(t, sock+" to be told it was rejected", func() bool {
			_, statuses := fakes[sock].calls()
			return len(statuses) > 0
		})
		_, statuses := fakes[sock].calls()
		st := statuses[0]
		if st.PluginRegistered {
			t.Errorf("%s: registrar told PluginRegistered=true", sock)
		}
		if !strings.Contains(st.Error, tc.wantErr) {
			t.Errorf("%s: rejection %q does not say %q", sock, st.Error, tc.wantErr)
		}
		if len(st.Error) > 600 {
			t.Errorf("%s: rejection is %d bytes long", sock, len(st.Error))
		}
	}
	if n, _ := hidden.calls(); n != 0 {
		t.Errorf("dot-file socket was asked GetInfo %d times, want it ignored", n)
	}
	for _, ev := range evs.snapshot() {
		if ev.Type == registry.Rejected && (strings.HasSuffix(ev.Socket, "/x.sock") || strings.HasSuffix(ev.Socket, "/.hidden.sock")) {
			t.Errorf("ignored file %s produced a rejection: %v", ev.Socket, ev.Err)
		}
	}
	drivers := r.List()
	if len(drivers) != 1 || drivers[0].Name != good.Name {
		t.Errorf("registered drivers = %v, want only %s", drivers, good.Name)
	}
}

// TestSecondRegistrationOfSameName checks the kubelet's replacement rule: a
// second registration of a healthy driver through another socket is refused
// at an equal version, accepted at a higher one, and then only the newer
// socket's removal deregisters the driver.
func TestSecondRegistrationOfSameName(t *testing.T) {
	regDir := shortDir(t)
	p := plugintest.Start(t, plugintest.Options{})
	r, evs := startRegistry(t, registry.Config{Dir: regDir})

	first := &fakeRegistrar{info: &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: p.Name, Endpoint: p.Endpoint, SupportedVersions: []string{"1.0.0"}}}
	firstSock := filepath.Join(regDir, "first.sock")
	serveRegistrar(t, firstSock, first)
	eventually(t, "first registration", func() bool { _, ok := r.Driver(p.Name); return ok })

	same := &fakeRegistrar{info: &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: p.Name, Endpoint: p.Endpoint, SupportedVersions: []string{"1.0.0"}}}
	serveRegistrar(t, filepath.Join(regDir, "same.sock"), same)
	eventually(t, "equal-version duplicate to be rejected", func() bool { _, st := same.calls(); return len(st) > 0 })
	if _, st := same.calls(); st[0].PluginRegistered || !strings.Contains(st[0].Error, "already registered through "+firstSock) {
		t.Fatalf("duplicate told %+v, want a rejection naming %s", st[0], firstSock)
	}
	if d, _ := r.Driver(p.Name); d.RegistrationSocket != firstSock {
		t.Fatalf("duplicate replaced the registration: socket %s", d.RegistrationSocket)
	}

	newer := &fakeRegistrar{info: &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: p.Name, Endpoint: p.Endpoint, SupportedVersions: []string{"1.1.0"}}}
	newerSock := filepath.Join(regDir, "newer.sock")
	serveRegistrar(t, newerSock, newer)
	eventually(t, "higher version to replace the registration", func() bool {
		d, _ := r.Driver(p.Name)
		return d.RegistrationSocket == newerSock && d.Version == "1.1.0"
	})

	// The older socket going away no longer deregisters the driver.
	if err := os.Remove(firstSock); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(newerSock); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deregistration by the newer socket", func() bool {
		return slices.ContainsFunc(evs.snapshot(), func(e registry.Event) bool { return e.Type == registry.Deregistered })
	})
	if _, ok := r.Driver(p.Name); ok {
		t.Error("driver still registered after its Deregistered event")
	}
	var deregs int
	for _, ev := range evs.snapshot() {
		if ev.Type == registry.Deregistered {
			deregs++
			if ev.Socket != newerSock {
				t.Errorf("deregistered through %s, want %s", ev.Socket, newerSock)
			}
		}
	}
	if deregs != 1 {
		t.Errorf("%d Deregistered events, want 1", deregs)
	}
}
