// Package gobuild builds a main package of this module once per test binary,
// for tests that run it as a real process (the CSI test plugin, the agent).
// The binary is built with -race when the test binary is, into a fixed
// directory under os.TempDir, and replaced atomically there.
package gobuild
