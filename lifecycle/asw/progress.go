package asw

import (
	"fmt"
	"time"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// Progress is how far a long setup step on one pod's volume has come,
// while it runs: the recursive fsGroup ownership change after a publish,
// which takes minutes on a volume with millions of files.
type Progress struct {
	// Step is the step in progress.
	Step volume.Step
	// FSGroup is the group the files are given.
	FSGroup int64
	// Files counts the files and directories done.
	Files int64
	// Started is when the step began.
	Started time.Time
	// Updated is when Files was counted.
	Updated time.Time
}

// String says what is in progress, for a pod condition, e.g. "changing the
// group of the volume's files to fsGroup 2000: 125000 files in 31s".
func (p Progress) String() string {
	return fmt.Sprintf("changing the group of the volume's files to fsGroup %d: %d files in %s",
		p.FSGroup, p.Files, p.Updated.Sub(p.Started).Round(time.Second))
}

// RecordProgress records, or with nil clears, the progress of a step on
// one pod's volume. Recording creates the pod's entry (NotPublished, as a
// first publish in progress is) if needed; clearing does not. RecordPublish
// clears it too.
func (w *World) RecordProgress(key volume.PodKey, id volume.ID, p *Progress) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p == nil {
		if e, ok := w.byPod[key.Pod][key.Volume]; ok {
			e.progress = nil
		}
		return
	}
	c := *p
	w.pod(key, id).progress = &c
}
