// Package agenttest runs the csi-volmgr agent binary as a real process for
// tests: it builds the binary once per test binary (with -race when the test
// binary has it), starts it against a kubeconfig on a free HTTP port, kills
// it the way a crash would, stops it the way a node drain would, restarts it
// over the same root directory, and reads its JSON status API, /readyz and
// /metrics. A failed test prints the end of the agent's log.
//
//	a := agenttest.New(t, agenttest.Options{KubeConfig: env.KubeConfig, NodeName: node})
//	p := plugintest.Start(t, plugintest.Options{RegistrationDir: a.RegistrationDir})
//	if err := a.Start(t.Context()); err != nil {
//		t.Fatal(err)
//	}
package agenttest
