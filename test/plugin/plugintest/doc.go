// Package plugintest runs the csi-volmgr test CSI plugin (package test/plugin) as a real process
// for tests in other packages: it builds the binary once per test binary, starts, kills, stops and
// restarts the process over the same state, reads and waits on its journal, sets its fault rules,
// and on cleanup unmounts everything the plugin mounted so that a failed test leaves nothing behind.
//
// From a test, Start registers all cleanup with t.Cleanup:
//
//	p := plugintest.Start(t, plugintest.Options{Capabilities: &caps})
//	conn, err := p.Dial()
//
// From TestMain, where there is no testing.TB, use Launch and call Close yourself.
package plugintest
