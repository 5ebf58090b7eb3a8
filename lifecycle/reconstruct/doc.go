// Package reconstruct rebuilds the actual state of world when the agent
// starts, before anything may be torn down: from the staged-volume records
// beside every staging path (written before NodeStageVolume, removed after
// NodeUnstageVolume, so a volume that was unpublished but not yet unstaged
// when the agent died is still found — kubernetes#85476), from the publish
// records in the pod volume directories, and from the mount table.
//
// Everything found is recorded as uncertain, except what the mount table
// proves: a staging path or target path that is still a mount point is
// recorded as staged or published, so that a pod that still wants it gets no
// redundant CSI call, while one that does not is torn down like any other.
package reconstruct
