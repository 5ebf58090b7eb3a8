package chaos

import "time"

// Invariant names one property the harness checks.
type Invariant string

// The invariants, in the order the report lists them.
const (
	// InvUnpublishLive: NodeUnpublishVolume of a pod's target before the harness deleted the pod.
	InvUnpublishLive Invariant = "no NodeUnpublishVolume of a live pod's volume"
	// InvUnstageWanted: NodeUnstageVolume of a volume a live pod wants: one whose publish is in
	// effect, or one the pod wanted since before the stage that is being undone.
	InvUnstageWanted Invariant = "no NodeUnstageVolume of a volume a live pod wants"
	// InvUnstagePublished: NodeUnstageVolume while a publish of the volume (any pod's) is still in
	// effect or uncertain: unpublish must come first.
	InvUnstagePublished Invariant = "no NodeUnstageVolume before every NodeUnpublishVolume"
	// InvPublishUnstaged: NodePublishVolume of a volume of a staging driver that the journal does
	// not show staged (an OK NodeStageVolume at that staging path, not undone since).
	InvPublishUnstaged Invariant = "no NodePublishVolume without a prior NodeStageVolume"
	// InvDetachStaged: the attach/detach controller (emulated) detached a volume the node still
	// had staged or published, because the agent dropped it from node.status.volumesInUse.
	InvDetachStaged Invariant = "no volume detached while staged (volumesInUse)"
	// InvPathEscape: a staging or target path the agent sent that is not the layout's path for
	// the volume (or the pod), below the root.
	InvPathEscape Invariant = "every CSI path is the layout's, below <root>"
	// InvLostUnstage: a volume still staged (or uncertain) once no pod wanted it and everything
	// converged.
	InvLostUnstage Invariant = "every stage unstaged once unwanted (no lost unstage)"
	// InvLeak: a mount, record file, directory or loop device left after all pods are gone, or a
	// pod whose deletion the agent never completed.
	InvLeak Invariant = "no leaked mount, record or loop device"
	// InvNotReady: a live pod without VolumesReady=True for longer than Config.ReadyBound of
	// healthy time (the agent ready, the API server up, no nemesis fault on the pod's plugins or
	// the node), counted from its creation or from the last sample that saw it ready. A pod
	// deleted before it reached the bound does not count.
	InvNotReady Invariant = "every live pod VolumesReady=True within the bound"
	// InvReadyUnmounted: a live pod VolumesReady=True while one of its targets is not in the
	// mount table (/proc/self/mountinfo), for longer than Config.ReadyGrace of healthy time.
	InvReadyUnmounted Invariant = "no VolumesReady=True while a target is not mounted"
	// InvUnmountLive: a mount the mount table showed disappears while it is still wanted: the
	// target, block map bind mount or a subPath mount of a live pod, or the staging mount of a
	// volume a live pod wants (as for InvUnstageWanted). It sees every unmount, the agent's own
	// ones too, which never reach a plugin's journal.
	InvUnmountLive Invariant = "no mount of a live pod's volume unmounted (mount table)"
	// InvCrash: the agent exited without being killed by the harness, or its log shows a panic,
	// a fatal error or a data race.
	InvCrash Invariant = "no agent crash other than the inflicted ones"
)

// Invariants lists every invariant in report order.
var Invariants = []Invariant{
	InvUnpublishLive, InvUnstageWanted, InvUnstagePublished, InvPublishUnstaged, InvDetachStaged,
	InvPathEscape, InvLostUnstage, InvLeak, InvNotReady, InvReadyUnmounted, InvUnmountLive, InvCrash,
}

// Violation is one observed violation of an invariant.
type Violation struct {
	Invariant Invariant
	Time      time.Time
	Detail    string
}
