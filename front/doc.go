// Package front is csi-volmgr's own CSI endpoint: a gRPC server on a unix
// socket in front of one registered CSI driver (the backend), looked up by
// name in the driver registry on every call, so a re-registration is picked
// up without a restart. Identity answers as the backend, Controller and
// GroupController calls pass through to it unchanged, and Node calls go
// through lifecycle/operations, so a container orchestrator's steps are
// serialized with the reconciler's on the same volume, recorded in the
// actual state, checkpointed and counted exactly like them.
package front
