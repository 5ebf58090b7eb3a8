// Package localattach attaches volumes in standalone mode, where neither an
// attach/detach controller nor an external-attacher runs: it is both, for
// this node only. Wrap puts it around the lifecycle's steps so that the
// reconciler does not change: WaitForAttach first calls
// ControllerPublishVolume (when the driver's policy requires attach and the
// driver has the controller capability PUBLISH_UNPUBLISH_VOLUME; a driver
// without it counts as attached without a call, as the external-attacher
// treats it), with the node ID the driver reported in NodeGetInfo, and then
// lets lifecycle/operations read the outcome through Get as the
// VolumeAttachment it would read in a cluster, publish_context included.
// After a successful Unstage the volume is released, and detached with
// ControllerUnpublishVolume unless it is wanted again by then.
//
// Attach and detach of one volume are serialized, and a detach is decided
// under that lock against the desired and actual states (Config.InUse), so
// a volume is never detached while a pod wants it or it may be staged. A
// record of every ControllerPublishVolume is written durably before the
// call (<root>/standalone/attachments) and removed after the detach, so a
// volume attached before a crash or restart is detached once the desired
// state has synced and does not want it.
package localattach
