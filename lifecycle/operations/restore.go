package operations

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// StateRestorer records what a previous agent left, as lifecycle/reconstruct
// does for the kubelet layout; *asw.World implements it.
type StateRestorer interface {
	// AddReconstructedVolume records a volume as staged-uncertain and
	// reconstructed, unless the volume is known.
	AddReconstructedVolume(name volume.Name, id asw.VolumeID, stagingPath string)
	// AddReconstructedPod records a pod's publish as uncertain and
	// reconstructed, unless the entry is known.
	AddReconstructedPod(key volume.PodKey, id asw.VolumeID, targetPath string)
}

var _ StateRestorer = &asw.World{}

// RestoreResult counts what RestoreRequests found.
type RestoreResult struct {
	// Staged and Published count the stages and publishes restored.
	Staged, Published int
	// ProvenStaged and ProvenPublished count those whose path is still a
	// mount point.
	ProvenStaged, ProvenPublished int
	// Failed lists the records that could not be restored; they are left
	// on disk and alone.
	Failed []error
}

// RestoreRequests puts back into the actual state what a container
// orchestrator had staged and published through the front endpoint before
// the agent restarted, from the records under <root>/front: each as
// uncertain and reconstructed, marked External, and proven Staged or
// Published when its path is still a mount point. So a CO's repeated
// request after the restart is sent to the driver again (never answered
// from memory), and its unpublish or unstage tears down what is there.
// Call it once at
// start, before the front endpoint serves; a record naming a volume the
// actual state holds as the reconciler's is not restored.
func (o *Operations) RestoreRequests(ctx context.Context) (RestoreResult, error) {
	logger := klog.FromContext(ctx)
	var res RestoreResult
	records, err := o.layout.CallerRecords()
	if err != nil {
		res.Failed = append(res.Failed, err)
	}
	// CallerRecords lists a volume's staged record before its publish
	// records, so a publish finds its volume restored already.
	for _, r := range records {
		if err := o.restoreRecord(ctx, r, &res); err != nil {
			logger.Error(err, "Cannot restore a front endpoint record; leaving it alone", "record", r.Record)
			res.Failed = append(res.Failed, err)
		}
	}
	logger.Info("Restored the front endpoint's volumes", "staged", res.Staged, "stagedIntact", res.ProvenStaged,
		"published", res.Published, "publishedIntact", res.ProvenPublished, "failed", len(res.Failed))
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("restoring %d of the front endpoint's records failed: %w", len(res.Failed), errors.Join(res.Failed...))
	}
	return res, nil
}

func (o *Operations) restoreRecord(ctx context.Context, r paths.CallerRecord, res *RestoreResult) error {
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
		if v, ok := o.state.Volume(name); ok && !v.External {
			return fmt.Errorf("staged record %s: %w: %s is staged by the reconciler", r.Record, volume.ErrInUse, name)
		}
		o.state.AddReconstructedVolume(name, id, rec.StagingPath)
		o.state.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.StageUncertain, StagingPath: rec.StagingPath, External: true})
		res.Staged++
		if o.mounted(ctx, rec.StagingPath) {
			o.state.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: rec.StagingPath, External: true})
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
	if p, ok := o.state.Pod(key); ok && !p.External {
		return fmt.Errorf("publish record %s: %w: %s is the reconciler's", r.Record, volume.ErrInUse, key)
	}
	if _, known := o.state.Volume(name); !known {
		// Published without a stage this agent recorded: not staged.
		o.state.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.NotStaged})
	}
	o.state.AddReconstructedPod(key, id, rec.TargetPath)
	o.state.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.PublishUncertain, TargetPath: rec.TargetPath, External: true})
	res.Published++
	if o.mounted(ctx, rec.TargetPath) {
		o.state.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: rec.TargetPath, External: true})
		res.ProvenPublished++
	}
	return nil
}

// restoredVolume checks that a record lies where its driver and handle put
// it and names a clean absolute path, and returns its volume.
func restoredVolume(r paths.CallerRecord, driver, handle string, recorded volume.Name, path string) (volume.Name, asw.VolumeID, error) {
	if driver != r.Driver || paths.HandleHash(handle) != r.HandleHash {
		return "", asw.VolumeID{}, fmt.Errorf("record %s: %w: it names driver %q and a handle that do not match its directory", r.Record, volume.ErrInvalidName, driver)
	}
	name := volume.PersistentName(driver, handle)
	if recorded != "" && recorded != name {
		return "", asw.VolumeID{}, fmt.Errorf("record %s: %w: it names volume %q, its fields say %q", r.Record, volume.ErrInvalidName, recorded, name)
	}
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || strings.ContainsRune(path, 0) {
		return "", asw.VolumeID{}, fmt.Errorf("record %s: %w: path %q is not a clean absolute path", r.Record, volume.ErrInvalidName, path)
	}
	return name, asw.VolumeID{Driver: driver, Handle: handle}, nil
}

// mounted says whether path is still a mount point; any doubt means no.
func (o *Operations) mounted(ctx context.Context, path string) bool {
	ok, err := o.mounts.IsMountPoint(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		klog.FromContext(ctx).V(2).Info("Mount not proven intact", "path", path, "err", err)
	}
	return err == nil && ok
}
