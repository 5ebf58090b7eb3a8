package reconstruct

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// front puts back into the actual state what a container orchestrator had
// staged and published through the front endpoint before the agent
// restarted, from the records under <root>/front: each as uncertain and
// reconstructed, marked External, and proven Staged or Published when its
// path is still a mount point. So a CO's repeated request after the restart
// is sent to the driver again (never answered from memory), and its
// unpublish or unstage tears down what is there. It runs after the kubelet
// layout is reconstructed: a record naming a volume the actual state holds
// as the reconciler's is not restored.
func front(ctx context.Context, layout paths.Layout, mounts Mounts, st ActualState) Result {
	logger := klog.FromContext(ctx)
	var res Result
	records, err := layout.CallerRecords()
	if err != nil {
		logger.Error(err, "Cannot read some of the front endpoint's records; leaving them alone")
		res.Failed = append(res.Failed, err)
	}
	// CallerRecords lists a volume's staged record before its publish
	// records, so a publish finds its volume restored already.
	for _, r := range records {
		if err := frontRecord(ctx, r, mounts, st, &res); err != nil {
			logger.Error(err, "Cannot restore a front endpoint record; leaving it alone", "record", r.Record)
			res.Failed = append(res.Failed, err)
		}
	}
	logger.Info("Restored the front endpoint's volumes", "staged", res.Staged, "stagedIntact", res.ProvenStaged,
		"published", res.Published, "publishedIntact", res.ProvenPublished, "failed", len(res.Failed))
	return res
}

func frontRecord(ctx context.Context, r paths.CallerRecord, mounts Mounts, st ActualState, res *Result) error {
	if r.Pod == "" {
		rec, err := checkpoint.ReadStage(r.Record)
		if err != nil {
			return err
		}
		name, id, err := restoredVolume(r, rec.DriverName, rec.VolumeHandle, rec.VolumeName, rec.StagingPath)
		if err != nil {
			return err
		}
		id.PVName, id.AccessType = rec.PVName, rec.AccessType
		if v, ok := st.Volume(name); ok && !v.External {
			return fmt.Errorf("staged record %s: %w: %s is staged by the reconciler", r.Record, volume.ErrInUse, name)
		}
		st.AddReconstructedVolume(name, id, rec.StagingPath)
		st.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.StageUncertain, StagingPath: rec.StagingPath, External: true})
		res.Staged++
		migrate(ctx, r.Record, res)
		if intact(ctx, mounts, rec.StagingPath) {
			st.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: rec.StagingPath, External: true})
			res.ProvenStaged++
		}
		return nil
	}
	rec, err := checkpoint.ReadPublish(r.Record)
	if err != nil {
		return err
	}
	if rec.PodUID != r.Pod {
		return fmt.Errorf("publish record %s: %w: it names pod %q", r.Record, volume.ErrInvalidName, rec.PodUID)
	}
	name, id, err := restoredVolume(r, rec.DriverName, rec.VolumeHandle, rec.VolumeName, rec.TargetPath)
	if err != nil {
		return err
	}
	id.AccessType = rec.AccessType
	key := volume.PodKey{Volume: name, Pod: r.Pod}
	if p, ok := st.Pod(key); ok && !p.External {
		return fmt.Errorf("publish record %s: %w: %s is the reconciler's", r.Record, volume.ErrInUse, key)
	}
	if _, known := st.Volume(name); !known {
		// Published without a stage this agent recorded: not staged.
		st.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.NotStaged})
	}
	st.AddReconstructedPod(key, id, rec.TargetPath)
	st.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.PublishUncertain, TargetPath: rec.TargetPath, External: true})
	res.Published++
	migrate(ctx, r.Record, res)
	if intact(ctx, mounts, rec.TargetPath) {
		st.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: rec.TargetPath, External: true})
		res.ProvenPublished++
	}
	return nil
}

// restoredVolume checks that a record lies where its driver and handle put
// it and names a clean absolute path, and returns its volume.
func restoredVolume(r paths.CallerRecord, driver, handle string, recorded volume.Name, path string) (volume.Name, volume.ID, error) {
	if driver != r.Driver || paths.HandleHash(handle) != r.HandleHash {
		return "", volume.ID{}, fmt.Errorf("record %s: %w: it names driver %q and a handle that do not match its directory", r.Record, volume.ErrInvalidName, driver)
	}
	name := volume.PersistentName(driver, handle)
	if recorded != "" && recorded != name {
		return "", volume.ID{}, fmt.Errorf("record %s: %w: it names volume %q, its fields say %q", r.Record, volume.ErrInvalidName, recorded, name)
	}
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || strings.ContainsRune(path, 0) {
		return "", volume.ID{}, fmt.Errorf("record %s: %w: path %q is not a clean absolute path", r.Record, volume.ErrInvalidName, path)
	}
	return name, volume.ID{Driver: driver, Handle: handle}, nil
}
