// Package registry discovers CSI drivers the way a kubelet does: through
// kubelet plugin-registration sockets (pluginregistration v1) in one
// directory, walked at start and then watched with fsnotify. It keeps one
// csiclient connection per registered driver and tells observers when a
// driver registers, deregisters or is rejected.
//
// Each registration socket goes through this state machine. Steps for one
// socket never run concurrently (a workqueue keyed by socket path), and steps
// for one driver name are serialized by a per-name lock, so a registration and
// a deregistration of the same driver never interleave.
//
//	                       +------------------------------------------+
//	                       |              ReRegistration              |
//	                       |  socket (re)created with the same name   |
//	                       v                                          +
//	socket created ---> GetInfo ---> Validate ---> Connect ---> NodeGetInfo ---> Install ---> Registered ---> socket deleted ---> Deregistered
//	                       |            |             |              |             |                                                |
//	                       +------------+-------------+--------------+-------------+--> NotifyRegistrationStatus(false)            Uninstall
//	                                     retried with backoff (500ms doubling to 2m)
//
// A socket that does not answer (stale file, connection refused, hang) is
// handled on its own goroutine, bounded by the handshake timeout, and retried
// with backoff; it never blocks other sockets. Dot-files and files that are
// not sockets are ignored.
package registry
