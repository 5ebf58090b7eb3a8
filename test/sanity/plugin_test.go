package sanity_test

import (
	"testing"

	"github.com/csi-volmgr/csi-volmgr/test/plugin"
	"github.com/csi-volmgr/csi-volmgr/test/plugin/plugintest"
)

// fullOptions turns on every capability of the test plugin, so that csi-sanity runs the most specs:
// controller publish, staging, stats, expansion, single-node-multi-writer, topology and a volume limit.
func fullOptions() plugintest.Options {
	caps := plugin.AllCapabilities()
	return plugintest.Options{
		Capabilities:      &caps,
		MaxVolumesPerNode: 4,
		Topology:          map[string]string{"topology.testplugin.csi-volmgr.io/node": plugintest.DefaultNodeID},
	}
}

// minimalOptions turns every optional capability off: no staging, no controller publish.
func minimalOptions() plugintest.Options {
	return plugintest.Options{Capabilities: &plugin.Capabilities{}}
}

func testPlugin(t *testing.T, opts plugintest.Options, accessType string) {
	if !ownProcess(t) {
		return
	}
	dir := t.TempDir()
	p := plugintest.Start(t, opts)
	runSanity(t, target{
		Address:                   p.Endpoint,
		AccessType:                accessType,
		Dir:                       dir,
		TestNodeVolumeAttachLimit: opts.MaxVolumesPerNode > 0,
	})
}

func TestSanityPluginMount(t *testing.T) {
	testPlugin(t, fullOptions(), "mount")
}

func TestSanityPluginBlock(t *testing.T) {
	testPlugin(t, fullOptions(), "block")
}

func TestSanityPluginMountMinimal(t *testing.T) {
	testPlugin(t, minimalOptions(), "mount")
}

func TestSanityPluginBlockMinimal(t *testing.T) {
	testPlugin(t, minimalOptions(), "block")
}
