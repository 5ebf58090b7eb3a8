package chaos

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// VolKey identifies a volume: its driver and handle.
type VolKey struct {
	Driver, Handle string
}

func (k VolKey) String() string { return k.Driver + "^" + k.Handle }

// Vol is what the checker knows of a volume.
type Vol struct {
	Key VolKey
	// Stages says the volume is staged before it is published (a driver with STAGE_UNSTAGE_VOLUME
	// and a volume that is not inline).
	Stages bool
	// StagingPath is the layout's staging path; empty when the volume is not staged.
	StagingPath string
}

// PodVolume is one volume of a pod and the paths the layout gives it.
type PodVolume struct {
	Vol    VolKey
	Target string
	// MapFile is, for a block volume, the agent's bind mount of the device in the global map
	// path; empty for a filesystem volume.
	MapFile string
	// SubPaths is the directory below which the subPath mounts of the volume are.
	SubPaths string
}

// Pod is what the checker knows of a pod the workload made.
type Pod struct {
	UID  types.UID
	Name string
	// Created is when the API server had accepted the pod.
	Created time.Time
	// DeleteIssued is when the harness started deleting the pod; zero while it is live.
	DeleteIssued time.Time
	Volumes      []PodVolume
}

// live says whether the pod is live at t: created and not yet being deleted.
func (p *Pod) live(t time.Time) bool {
	return p.DeleteIssued.IsZero() || t.Before(p.DeleteIssued)
}
