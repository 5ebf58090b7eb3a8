//go:build race

package gobuild

// raceEnabled is true when the test binary is built with -race; the binaries it builds are then built with it too.
const raceEnabled = true
