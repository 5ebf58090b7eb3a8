package registry_test

import (
	"path/filepath"
	"testing"

	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestRestartWithoutRegistrationIsReported: a driver killed and started
// again at its socket while its registrar keeps running registers no more;
// the registry reports it as Reconnected, through the same client, once
// the driver answers GetPluginInfo with its name, and no registration
// happens.
func TestRestartWithoutRegistrationIsReported(t *testing.T) {
	dir := shortDir(t)
	p := plugintest.Start(t, plugintest.Options{})
	registrar := &fakeRegistrar{info: registerInfo(p)}
	serveRegistrar(t, filepath.Join(dir, "driver-reg.sock"), registrar)
	r, evs := startRegistry(t, registry.Config{Dir: dir})
	count := func(typ registry.EventType) int {
		n := 0
		for _, ev := range evs.snapshot() {
			if ev.Type == typ && ev.Driver == p.Name {
				n++
			}
		}
		return n
	}
	eventually(t, "the driver registered", func() bool { return count(registry.Registered) == 1 })
	client, _ := r.Client(p.Name)

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the driver reported as reconnected", func() bool { return count(registry.Reconnected) == 1 })
	if n := count(registry.Registered); n != 1 {
		t.Errorf("%d registrations, want the first one only", n)
	}
	if getInfos, _ := registrar.calls(); getInfos != 1 {
		t.Errorf("the registrar was asked GetInfo %d times, want once", getInfos)
	}
	if again, _ := r.Client(p.Name); again != client {
		t.Errorf("the driver's client was replaced; a reconnection keeps it")
	}
}
