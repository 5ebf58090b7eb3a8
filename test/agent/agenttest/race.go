//go:build race

package agenttest

// raceEnabled is true when the test binary is built with -race; the agent binary is then built with it too.
const raceEnabled = true
