// Package app holds the csi-volmgr command line: the cobra commands, their
// flags and the wiring from flags to the agent's packages. Nothing below
// cmd/ parses flags.
package app
