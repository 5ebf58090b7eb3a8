package registry_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/driver/registry"
	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// TestReregistrationLetsCallsInFlightFinish: when the registrar serves its
// socket anew (it restarted) while a call to the driver is in flight, the
// driver registers again and the call still completes: the replaced
// connection is not closed under it.
func TestReregistrationLetsCallsInFlightFinish(t *testing.T) {
	dir := shortDir(t)
	p := plugintest.Start(t, plugintest.Options{})
	socket := filepath.Join(dir, "driver-reg.sock")
	stopFirst := serveRegistrarManual(t, socket, &fakeRegistrar{info: registerInfo(p)})
	defer stopFirst()
	r, evs := startRegistry(t, registry.Config{Dir: dir})
	registrations := func() int {
		n := 0
		for _, ev := range evs.snapshot() {
			if ev.Type == registry.Registered && ev.Driver == p.Name {
				n++
			}
		}
		return n
	}
	eventually(t, "the driver registered", func() bool { return registrations() == 1 })
	client, _ := r.Client(p.Name)

	if err := p.SetFaults(plugin.FaultRule{Method: "Probe", Delay: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := client.Probe(t.Context())
		done <- err
	}()
	eventually(t, "Probe in the plugin", func() bool {
		entries, err := p.ReadJournal()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range plugin.Calls(entries) {
			if c.Begin.Method == "Probe" {
				return true
			}
		}
		return false
	})
	// The registrar comes back: a new socket replaces the old one in place.
	t.Cleanup(serveRegistrarManual(t, socket, &fakeRegistrar{info: registerInfo(p)}))
	eventually(t, "the driver registered again", func() bool { return registrations() == 2 })
	if err := <-done; err != nil {
		t.Errorf("Probe in flight during the re-registration: %v, want it to complete", err)
	}
	if again, _ := r.Client(p.Name); again == client {
		t.Errorf("the re-registration kept the old client")
	}
}
