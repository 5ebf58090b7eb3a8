package sanity_test

import (
	"os"
	"testing"
	"time"

	"github.com/csi-volmgr/csi-volmgr/front/fronttest"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// registrationTimeout bounds the wait for the test plugin to register with the front's registry.
const registrationTimeout = 60 * time.Second

// testFrontAgainstDirect runs csi-sanity twice in processes of their own, with the test plugin in
// the same configuration: directly against the plugin ("direct"), and against csi-volmgr's front
// endpoint fronting the plugin, which registers through its registration socket ("front"). It
// prints both counts and fails unless the front run has no failure and exactly as many passed
// specs as the direct one, so that a failure can be attributed to the front or to the plugin.
func testFrontAgainstDirect(t *testing.T, opts plugintest.Options, accessType string) {
	var direct, front summary
	directOK := t.Run("direct", func(t *testing.T) {
		var child bool
		if direct, child = sanityProcess(t); child {
			testPluginDirect(t, opts, accessType)
		}
	})
	frontOK := t.Run("front", func(t *testing.T) {
		var child bool
		if front, child = sanityProcess(t); child {
			testPluginThroughFront(t, opts, accessType)
		}
	})
	if os.Getenv(childEnv) != "" {
		return
	}
	t.Logf("csi-sanity %s: direct: %s; front: %s", accessType, direct, front)
	switch {
	case front.Failed != 0:
		t.Errorf("csi-sanity through the front: %d failed specs (direct: %d)", front.Failed, direct.Failed)
	case front.Passed != direct.Passed:
		t.Errorf("csi-sanity through the front passed %d specs, directly against the plugin %d", front.Passed, direct.Passed)
	case front.Passed == 0 || !directOK || !frontOK:
		t.Errorf("csi-sanity runs did not complete: direct ok %v, front ok %v, %d passed", directOK, frontOK, front.Passed)
	}
}

// testPluginDirect is testPlugin's body, in the child process.
func testPluginDirect(t *testing.T, opts plugintest.Options, accessType string) {
	dir := t.TempDir()
	p := plugintest.Start(t, opts)
	runSanity(t, target{
		Address:                   p.Endpoint,
		AccessType:                accessType,
		Dir:                       dir,
		TestNodeVolumeAttachLimit: opts.MaxVolumesPerNode > 0,
	})
}

// testPluginThroughFront starts the test plugin with a registration socket, the front endpoint
// over a registry watching that directory, and runs csi-sanity against the front.
func testPluginThroughFront(t *testing.T, opts plugintest.Options, accessType string) {
	dir := t.TempDir()
	regDir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(regDir) })
	opts.RegistrationDir = regDir
	p := plugintest.Start(t, opts)
	stack := fronttest.Start(t, fronttest.Options{Driver: p.Name, RegistrationDir: regDir})
	stack.WaitForDriver(t, p.Name, registrationTimeout)
	runSanity(t, target{
		Address:                   stack.Endpoint,
		AccessType:                accessType,
		Dir:                       dir,
		TestNodeVolumeAttachLimit: opts.MaxVolumesPerNode > 0,
	})
}
