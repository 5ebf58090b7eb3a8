//go:build race

package deploy_test

// raceEnabled is true when the test binary has the race detector; the agent
// binary is then built with it too.
const raceEnabled = true
