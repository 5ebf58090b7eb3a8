// Package fronttest runs the front endpoint for tests over real components:
// a driver registry watching a registration directory, the lifecycle's
// operations and actual state under a temporary root, and the front's gRPC
// server on a real unix socket. The fronted driver is whatever registers
// through the directory, e.g. the CSI test plugin.
package fronttest
