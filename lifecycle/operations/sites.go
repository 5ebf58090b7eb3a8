package operations

import (
	"path/filepath"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// A step's site is where it leaves traces: the path the driver mounts at and
// the record that proves it. The reconciler's steps use the kubelet layout
// under the root, where the agent creates and removes the directories
// itself. A container orchestrator's steps through the front endpoint use
// the staging and target paths the caller chose — the caller creates and
// removes those, the agent only checks that nothing is left mounted — and
// keep their records under <root>/front (paths.CallerVolume).

// stagingSite is where a volume is staged and its staged record kept.
type stagingSite struct {
	// Staging holds the record's directory and file, and the
	// staging_target_path (Path).
	paths.Staging
	// caller marks a staging path chosen by a container orchestrator.
	caller bool
}

// publishingSite is where a pod's use of a volume is published and its
// publish record kept.
type publishingSite struct {
	// Publishing holds the record's directory and file, and the target_path
	// (Target).
	paths.Publishing
	// caller marks a target path chosen by a container orchestrator.
	caller bool
}

// callerStaging returns the site of a volume a container orchestrator
// stages at path.
func (o *Operations) callerStaging(id volume.ID, path string) (stagingSite, error) {
	cv, err := o.layout.CallerVolume(id.Driver, id.Handle)
	if err != nil {
		return stagingSite{}, err
	}
	return stagingSite{Staging: paths.Staging{Dir: cv.Dir, Record: cv.StageRecord, Path: path}, caller: true}, nil
}

// callerPublishing returns the site of key's publish at a container
// orchestrator's target path.
func (o *Operations) callerPublishing(id volume.ID, key volume.PodKey, target string) (publishingSite, error) {
	cp, err := o.layout.CallerPublishing(id.Driver, id.Handle, key.Pod)
	if err != nil {
		return publishingSite{}, err
	}
	return publishingSite{Publishing: paths.Publishing{Dir: cp.Dir, Record: cp.Record, Target: target}, caller: true}, nil
}

// stagingSiteOf returns where a recorded volume is staged: the caller's
// recorded path for a container orchestrator's stage, the layout's
// otherwise.
func (o *Operations) stagingSiteOf(v asw.Volume) (stagingSite, error) {
	if v.External {
		return o.callerStaging(v.ID, v.StagingPath)
	}
	st, err := o.layout.Staging(v.ID)
	return stagingSite{Staging: st}, err
}

// removeStaging removes what a stage left: in the layout the staging path
// (unless still mounted), then the staged record and its directory, pruning
// empty parents up to <root>/plugins/kubernetes.io/csi; for a caller's
// staging path only the record, once the path is no longer mounted. The
// record goes last, so it outlives every other trace of the volume.
func (o *Operations) removeStaging(s stagingSite) error {
	if s.caller {
		if err := o.tree.checkUnmounted(s.Path); err != nil {
			return err
		}
		return o.tree.removeRecordDir(s.Record, s.Dir, o.layout.FrontDir())
	}
	if err := o.tree.removeMountPoint(s.Path); err != nil {
		return err
	}
	if filepath.Dir(s.Path) != s.Dir {
		// Block: volumeDevices/staging/<pv> lives outside the record directory.
		if err := o.tree.prune(filepath.Dir(s.Path), o.layout.PluginDir()); err != nil {
			return err
		}
	}
	if s.MapDir != "" {
		// Block: the global map path, empty by now (the kubelet's RemoveMapPath).
		if err := o.tree.prune(s.MapDir, o.layout.PluginDir()); err != nil {
			return err
		}
	}
	return o.tree.removeRecordDir(s.Record, s.Dir, o.layout.PluginDir())
}

// removePublishing removes what a publish left: in the layout the target
// (unless still mounted), then the publish record and every directory that
// became empty, up to <root>/pods for a filesystem volume's record and up
// to <root>/plugins/kubernetes.io/csi for a block volume's target and
// record; for a caller's target only the record, once the target is no
// longer mounted.
func (o *Operations) removePublishing(p publishingSite) error {
	if p.caller {
		if err := o.tree.checkUnmounted(p.Target); err != nil {
			return err
		}
		return o.tree.removeRecordDir(p.Record, p.Dir, o.layout.FrontDir())
	}
	if err := o.tree.removeMountPoint(p.Target); err != nil {
		return err
	}
	if targetDir := filepath.Dir(p.Target); targetDir != p.Dir {
		if err := o.tree.prune(targetDir, o.layout.PluginDir()); err != nil {
			return err
		}
	}
	stop := o.layout.PodsDir()
	if p.DeviceLink != "" {
		stop = o.layout.PluginDir() // block: the record is kept in volumeDevices/<name>/data
	}
	return o.tree.removeRecordDir(p.Record, p.Dir, stop)
}
