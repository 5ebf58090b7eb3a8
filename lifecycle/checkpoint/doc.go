// Package checkpoint keeps the agent's durable on-disk records: the per-pod
// vol_data.json written before NodePublishVolume and the staged-volume
// vol_data.json written before NodeStageVolume and removed only after
// NodeUnstageVolume succeeded. Records are written atomically (temporary
// file, rename); staged-volume records durably too (fsync of the file and
// of every directory entry made for it), in the kubelet's format, a
// JSON object of strings, so a reader of either tolerates the other's extra
// keys; unreadable records are reported as ErrCorrupt.
//
// Every record carries its format version (FormatKey, FormatVersion). A
// record without one was written before records were versioned and is
// migrated in place (Migrate); a record of a newer version is refused with
// a *FormatError and left as it is.
package checkpoint
