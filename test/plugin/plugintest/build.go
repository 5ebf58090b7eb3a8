package plugintest

import "github.com/csi-volmgr/csi-volmgr/test/gobuild"

// EnvBinary names an environment variable that points at a prebuilt csi-testplugin binary.
// When it is set, Binary returns it and builds nothing.
const EnvBinary = "CSI_TESTPLUGIN_BINARY"

var pluginBinary = gobuild.Binary{
	Package:     "github.com/csi-volmgr/csi-volmgr/test/plugin/cmd/csi-testplugin",
	Name:        "csi-testplugin",
	EnvOverride: EnvBinary,
}

// Binary returns the path of the csi-testplugin binary, built once per test binary (with -race
// when the test binary has it); see package gobuild.
func Binary() (string, error) { return pluginBinary.Path() }
