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

// Each configuration runs csi-sanity directly against the plugin and through csi-volmgr's front
// endpoint, and compares the two (see testFrontAgainstDirect).

func TestSanityPluginMount(t *testing.T) {
	testFrontAgainstDirect(t, fullOptions(), "mount")
}

func TestSanityPluginBlock(t *testing.T) {
	testFrontAgainstDirect(t, fullOptions(), "block")
}

func TestSanityPluginMountMinimal(t *testing.T) {
	testFrontAgainstDirect(t, minimalOptions(), "mount")
}

func TestSanityPluginBlockMinimal(t *testing.T) {
	testFrontAgainstDirect(t, minimalOptions(), "block")
}
