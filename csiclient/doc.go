// Package csiclient is the only code in csi-volmgr that calls CSI drivers.
// A Client holds one persistent, self-reconnecting gRPC connection to a
// driver's unix socket (csi-lib-utils connection), caches the driver's node
// capabilities until the connection is lost or the driver re-registers, and
// offers typed calls with a per-call timeout whose errors are classified as
// final, uncertain or already done (errors.go) with the gRPC status kept.
// Every request and reply is logged at V(5) with secrets stripped, and every
// call's latency is recorded in csi_operations_seconds (Metrics).
package csiclient
