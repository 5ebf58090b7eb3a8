//go:build race

package plugintest

// raceEnabled is true when the test binary is built with -race; the plugin binary is then built with it too.
const raceEnabled = true
