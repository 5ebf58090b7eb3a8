// Package asw is the actual state of world: what the agent has done on this
// node and can prove, per volume (attached and its publish_context, staged,
// stage uncertain or not staged, with what unstage needs) and per pod
// (published, publish uncertain or not), with the last error of each and a
// mark on states found at start-up. It is a thread-safe store that computes
// nothing and calls nothing; lifecycle/operations records outcomes in it and
// the reconciler and status read it.
package asw
