// Package plugin is a real CSI node and controller plugin for testing csi-volmgr: filesystem volumes
// are directories bind-mounted at the staging and target paths, block volumes are loop devices over
// sparse files bind-mounted onto files, and its state survives restarts. It also serves the kubelet
// plugin-registration API, records every call in a journal and injects faults read from a control file.
//
// # Volumes and mounts
//
// CreateVolume makes <state-dir>/volumes/<id> (a directory, access type mount) or
// <state-dir>/volumes/<id>.img (a sparse file, access type block). With STAGE_UNSTAGE_VOLUME,
// NodeStageVolume bind-mounts the directory at the staging path, or attaches a loop device and
// bind-mounts it onto <staging path>/device; NodePublishVolume bind-mounts from there to the target
// path (read-only when asked). Without staging, NodePublishVolume mounts from the volume directly.
// Whether a step is already done is read from the mount table, so a call repeated after the plugin
// was killed half-way completes instead of failing. The plugin enforces the order a CO must keep:
// publish needs the volume staged, unstage fails with FailedPrecondition while it is published,
// DeleteVolume fails while the volume is attached, staged or published, and with
// PUBLISH_UNPUBLISH_VOLUME the node calls need the publish_context {"devicePath": <backing path>}
// that ControllerPublishVolume returned.
//
// A filesystem volume created with the parameter FuseParameter="true" is served over FUSE by the
// plugin process itself (staging path: a loopback FUSE mount of its directory; target: a bind mount
// of that): when the plugin dies, its mounts answer ENOTCONN, as a FUSE driver's do, until
// NodeStageVolume and NodePublishVolume are repeated at the same paths. Any repeated stage or publish
// replaces a broken mount at its path. statfs of a FUSE volume reports the volume's size (grown by
// NodeExpandVolume), as a block-backed driver's file system would.
//
// With EXPAND_VOLUME, ControllerExpandVolume grows a volume and asks for node expansion; the size of
// a filesystem volume's file system (NodeGetVolumeStats' total) grows with NodeExpandVolume. With
// GET_VOLUME_HEALTH, NodeGetVolumeHealth reports the control file's health conditions for a volume
// and INACCESSIBLE for a broken mount. The control file can also change the node's volume limit
// (NodeGetInfo, ControllerPublishVolume's ResourceExhausted) at run time.
//
// A NodePublishVolume whose volume_context has csi.storage.k8s.io/ephemeral=true (a CSI inline
// volume; the CO sends it when the CSIDriver has podInfoOnMount) creates the filesystem volume
// named by its volume_id if it does not exist and mounts it without staging; the NodeUnpublishVolume
// of its last target deletes it, as csi-driver-host-path does.
//
// # State file
//
// <state-dir>/state/<volume-id>.json holds one volume (see Volume) and is replaced atomically
// (write a temporary file, fsync, rename, fsync the directory) on each change of that volume, so a
// call costs the write of one small record whatever the number of volumes. LoadState reads them.
//
// # Journal
//
// With --journal, every gRPC call, CSI and plugin-registration alike, appends JSON lines (see
// Entry): one "begin" line when the call arrives and one "end" line with the gRPC code name when it
// returns, both with the process ID and a per-process sequence number, plus "fault" lines for
// injected faults and one "start" line when the plugin serves. Each line is a single write(2) on an
// O_APPEND descriptor, so it survives the plugin being killed right after. A call whose "end" line
// is missing never returned. ReadJournal and Calls parse the file.
//
// # Fault injection
//
// With --control-file, the plugin reads the file on every call and applies it when its content
// changed; write it atomically (WriteFaultConfig does) so that no call sees half a file. A missing
// or empty file means no faults. Schema:
//
//	{
//	  "generation": "any text",        // optional; a new value resets the "times" counters
//	  "rules": [
//	    {
//	      "method":   "NodeStageVolume", // required: short gRPC method name, or "*" for all
//	      "volumeID": "vol-…",           // optional: only calls for this volume
//	      "delay":    "1.5s",            // optional: Go duration waited first (ends early if the call is cancelled)
//	      "hang":     true,              // optional: block until the caller cancels; not with exit or code
//	      "exit":     "before",          // optional: SIGKILL the plugin "before" the step or "after" it (before replying)
//	      "code":     "Unavailable",     // optional: return this gRPC code ("Unavailable" or "UNAVAILABLE") instead of doing the step; not with exit "after"
//	      "message":  "injected fault",  // optional: message for code
//	      "times":    1                  // optional: fire only this many times, counted across restarts; 0 = always
//	    }
//	  ],
//	  "volumeHealth": {                  // optional: NodeGetVolumeHealth conditions by volume ID
//	    "vol-…": {"status": "DEGRADED", "reason": "SlowDisk", "message": "…"}
//	  },
//	  "maxVolumesPerNode": 2,            // optional: replaces --max-volumes-per-node while set
//	  "bugs": ["ignore-readonly"],       // optional: driver bugs to switch on (see Bug), for csi-volmgr check's tests
//	  "strict": true,                    // optional: behave as stock drivers do with broken mounts (see FaultConfig.Strict)
//	  "requireNodeSecrets": ["metaurl"], // optional: keys NodeStage/NodePublishVolume need in their secrets (InvalidArgument without)
//	  "filesystemOnly": true             // optional: CreateVolume refuses block volumes (InvalidArgument)
//	}
//
// Rules are tried in order and the first matching rule with firings left applies; its actions run in
// the order delay, hang, exit before, code, the step itself, exit after. Firings are counted in
// <state-dir>/fault-counts.json per control-file content, so a rule with "times": 1 and "exit"
// kills the plugin once, not again after every restart.
package plugin
