package agenttest

import "github.com/csi-volmgr/csi-volmgr/test/gobuild"

// EnvBinary names an environment variable that points at a prebuilt csi-volmgr binary.
// When it is set, Binary returns it and builds nothing.
const EnvBinary = "CSI_VOLMGR_BINARY"

var agent = gobuild.Binary{
	Package:     "github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr",
	Name:        "csi-volmgr",
	EnvOverride: EnvBinary,
}

// Binary returns the path of the csi-volmgr binary, built once per test binary (with -race
// when the test binary has it); see package gobuild.
func Binary() (string, error) { return agent.Path() }
