// Package agent holds the process-level tests of the csi-volmgr binary: the
// agent runs as a real process against a real API server (test/k8s) and the
// real CSI test plugin, registered through its registration directory, with
// real mounts. They cover the command a user runs (issue 6) and the crash
// safety of the lifecycle (issue 4): the agent is SIGKILLed at chosen points
// and restarted, and what it did is read from the plugin's journal and the
// mount table. The package has no code of its own; see agenttest for the
// helper that runs the binary.
package agent
