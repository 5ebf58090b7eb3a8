package reconstruct

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/loopdev"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ActualState is where reconstruction records what it finds; *asw.World
// implements it.
type ActualState interface {
	// Volume returns what is recorded about a volume.
	Volume(name volume.Name) (asw.Volume, bool)
	// Pod returns what is recorded about one pod's publish of a volume.
	Pod(key volume.PodKey) (asw.Pod, bool)
	// AddReconstructedVolume records a staged volume as uncertain.
	AddReconstructedVolume(name volume.Name, id volume.ID, stagingPath string)
	// AddReconstructedPod records a pod's publish as uncertain.
	AddReconstructedPod(key volume.PodKey, id volume.ID, targetPath string)
	// RecordStage records a stage state the mount table proves.
	RecordStage(name volume.Name, id volume.ID, o asw.StageOutcome)
	// RecordPublish records a publish state the mount table proves.
	RecordPublish(key volume.PodKey, id volume.ID, o asw.PublishOutcome)
}

// Mounts inspects the mount table; k8s.io/mount-utils' mount.Interface
// implements it.
type Mounts interface {
	// IsMountPoint reports whether file is a mount point.
	IsMountPoint(file string) (bool, error)
}

var _ ActualState = &asw.World{}

// Result counts what reconstruction found.
type Result struct {
	// Staged and Published count the volumes and pod publishes recorded.
	Staged, Published int
	// ProvenStaged and ProvenPublished count those whose mount is intact.
	ProvenStaged, ProvenPublished int
	// Failed lists the records that could not be reconstructed (missing,
	// corrupt, or not matching their directory); they are left alone on
	// disk and logged.
	Failed []error
	// Removed counts the directories an interrupted step left without a
	// record and with nothing else in them, which were removed.
	Removed int
	// Migrated counts the records of an older format rewritten in the
	// current one (checkpoint.Migrate).
	Migrated int
}

func (r *Result) add(o Result) {
	r.Staged += o.Staged
	r.Published += o.Published
	r.ProvenStaged += o.ProvenStaged
	r.ProvenPublished += o.ProvenPublished
	r.Failed = append(r.Failed, o.Failed...)
	r.Removed += o.Removed
	r.Migrated += o.Migrated
}

// Run rebuilds the actual state into st, once at start before anything
// may be torn down: first from the kubelet layout under the root (the
// staged-volume records and the pod volume directories), then from the
// front endpoint's records (front). What fails is left alone on disk,
// logged and listed in Result.Failed; the error is for a root that cannot
// be scanned at all, or that holds a record of a newer format than this
// agent knows (checkpoint.ErrNewerFormat): then nothing is reconstructed,
// migrated or removed. Records of an older format are migrated in place
// once reconstructed.
func Run(ctx context.Context, layout paths.Layout, mounts Mounts, st ActualState) (Result, error) {
	if err := checkFormats(layout); err != nil {
		return Result{}, err
	}
	res, err := kubelet(ctx, layout, mounts, st)
	if err != nil {
		return res, err
	}
	res.add(front(ctx, layout, mounts, st))
	return res, nil
}

// kubelet reconstructs what the kubelet layout records.
func kubelet(ctx context.Context, layout paths.Layout, mounts Mounts, st ActualState) (Result, error) {
	logger := klog.FromContext(ctx)
	var res Result
	staged, err := layout.StagedVolumes()
	if err != nil {
		return res, fmt.Errorf("scan staged volumes: %w", err)
	}
	for _, sv := range staged {
		if err := reconstructStaged(ctx, layout, sv, mounts, st, &res); err != nil {
			if removed, rmErr := removeLeftover(sv.Dir, sv.Record, layout.PluginDir(), err); removed && rmErr == nil {
				logger.Info("Removed a staged-volume directory an interrupted step left empty", "dir", sv.Dir)
				res.Removed++
				continue
			}
			logger.Error(err, "Cannot reconstruct staged volume; leaving it alone", "dir", sv.Dir)
			res.Failed = append(res.Failed, err)
		}
	}
	pods, err := layout.PodVolumes()
	if err != nil {
		return res, fmt.Errorf("scan pod volumes: %w", err)
	}
	for _, pv := range pods {
		if err := reconstructPublished(ctx, pv, mounts, st, &res); err != nil {
			// A block volume's target lies outside the directory: it must not
			// be mounted either.
			if !intact(ctx, mounts, pv.Target) {
				// A block volume's directory is the kubelet's
				// volumeDevices/<name>/data/<pod>, below the plugin directory.
				stop := layout.PodsDir()
				if pv.AccessType == volume.Block {
					stop = layout.PluginDir()
				}
				if removed, rmErr := removeLeftover(pv.Dir, pv.Record, stop, err); removed && rmErr == nil {
					logger.Info("Removed a pod volume directory an interrupted step left empty", "dir", pv.Dir)
					res.Removed++
					continue
				}
			}
			logger.Error(err, "Cannot reconstruct pod volume; leaving it alone", "dir", pv.Dir)
			res.Failed = append(res.Failed, err)
		}
	}
	emptyPods, err := removeEmptyPodDirs(layout.PodsDir(), mounts)
	if err != nil {
		logger.Error(err, "Cannot scan the pod directories for empty ones; leaving them alone")
	}
	for _, dir := range emptyPods {
		logger.Info("Removed a pod directory an interrupted teardown left empty", "dir", dir)
		res.Removed++
	}
	logger.Info("Reconstructed actual state", "staged", res.Staged, "stagedIntact", res.ProvenStaged,
		"published", res.Published, "publishedIntact", res.ProvenPublished, "failed", len(res.Failed), "removed", res.Removed,
		"migrated", res.Migrated)
	return res, nil
}

func reconstructStaged(ctx context.Context, layout paths.Layout, sv paths.StagedVolume, mounts Mounts, st ActualState, res *Result) error {
	rec, err := checkpoint.ReadStage(sv.Record)
	if err != nil {
		return fmt.Errorf("staged record %s: %w", sv.Record, err)
	}
	if rec.DriverName != sv.Driver || paths.HandleHash(rec.VolumeHandle) != sv.HandleHash {
		return fmt.Errorf("staged record %s names driver %q and a handle that do not match its directory", sv.Record, rec.DriverName)
	}
	name := volume.PersistentName(rec.DriverName, rec.VolumeHandle)
	id := volume.ID{Driver: rec.DriverName, Handle: rec.VolumeHandle, PVName: rec.PVName, AccessType: rec.AccessType}
	// The staging path comes from the layout, never from the record.
	staging, err := layout.Staging(id)
	if err != nil {
		return fmt.Errorf("staged record %s: %w", sv.Record, err)
	}
	st.AddReconstructedVolume(name, id, staging.Path)
	res.Staged++
	migrate(ctx, sv.Record, res)
	proven := intact(ctx, mounts, staging.Path)
	if !proven && id.AccessType == volume.Block {
		// A block volume's staging path is a directory the driver mounts
		// its device (or whatever it needs) into.
		proven = mountedBelow(ctx, staging.Path)
	}
	if proven {
		st.RecordStage(name, id, asw.StageOutcome{Step: volume.StepStage, State: volume.Staged, StagingPath: staging.Path,
			SELinuxContext: rec.SELinuxMountContext})
		res.ProvenStaged++
	}
	return nil
}

func reconstructPublished(ctx context.Context, pv paths.PodVolume, mounts Mounts, st ActualState, res *Result) error {
	rec, err := checkpoint.ReadPublish(pv.Record)
	if err != nil {
		return fmt.Errorf("publish record %s: %w", pv.Record, err)
	}
	if rec.DriverName == "" || rec.VolumeHandle == "" {
		return fmt.Errorf("publish record %s: %w: no driver or volume handle", pv.Record, volume.ErrInvalidSpec)
	}
	name := volume.PersistentName(rec.DriverName, rec.VolumeHandle)
	if rec.VolumeLifecycleMode == storagev1.VolumeLifecycleEphemeral {
		name = volume.InlineName(pv.Pod, rec.SpecVolID)
	}
	if rec.VolumeName != "" && rec.VolumeName != name {
		return fmt.Errorf("publish record %s names volume %q, its fields say %q", pv.Record, rec.VolumeName, name)
	}
	pvName := rec.SpecVolID
	if rec.VolumeLifecycleMode == storagev1.VolumeLifecycleEphemeral {
		pvName = ""
	}
	id := volume.ID{Driver: rec.DriverName, Handle: rec.VolumeHandle, PVName: pvName, AccessType: pv.AccessType}
	key := volume.PodKey{Volume: name, Pod: pv.Pod}
	// The target comes from the layout, never from the record.
	st.AddReconstructedPod(key, id, pv.Target)
	res.Published++
	migrate(ctx, pv.Record, res)
	proven := intact(ctx, mounts, pv.Target)
	presented := volume.Presentation{SELinuxContext: rec.SELinuxMountContext}
	if pv.AccessType == volume.Block {
		// A block publish is proven only with its map in place; otherwise
		// it is published (and mapped) again, or torn down.
		proven = proven && blockMapped(pv.Publishing)
		presented.DevicePath = pv.DeviceLink
	}
	if proven {
		st.RecordPublish(key, id, asw.PublishOutcome{Step: volume.StepPublish, State: volume.Published, TargetPath: pv.Target,
			Presentation: &presented})
		res.ProvenPublished++
	}
	return nil
}

// blockMapped says whether a block volume's map for one pod is in place:
// the global map shows a device held open by a loop device, and the pod's
// device links to the target.
func blockMapped(pub paths.Publishing) bool {
	fi, err := os.Lstat(pub.MapFile)
	if err != nil || fi.Mode()&os.ModeDevice == 0 {
		return false
	}
	if to, err := os.Readlink(pub.DeviceLink); err != nil || to != pub.Target {
		return false
	}
	_, err = loopdev.Find(pub.MapFile)
	return err == nil
}

// mountInfoPath is the mount table mountedBelow reads.
const mountInfoPath = "/proc/self/mountinfo"

// mountedBelow says whether anything is mounted below dir. The table is
// read with mount-utils' parser, the kubelet's, which leaves the kernel's
// octal escapes (a space is \040) in mount points: dir is escaped the same
// way before it is compared.
func mountedBelow(ctx context.Context, dir string) bool {
	infos, err := mount.ParseMountInfo(mountInfoPath)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Mount not proven intact", "path", dir, "err", err)
		return false
	}
	prefix := escapeMountPoint(filepath.Clean(dir)) + "/"
	for _, m := range infos {
		if strings.HasPrefix(m.MountPoint, prefix) {
			return true
		}
	}
	return false
}

// mountPointEscaper writes a path as the kernel writes a mount point in
// /proc/self/mountinfo (fs/proc_namespace.c, mangle " \t\n\\").
var mountPointEscaper = strings.NewReplacer(" ", `\040`, "\t", `\011`, "\n", `\012`, `\`, `\134`)

func escapeMountPoint(p string) string { return mountPointEscaper.Replace(p) }

// intact says whether path is still a mount point. Any doubt (missing,
// unreadable, "transport endpoint is not connected") means not proven.
func intact(ctx context.Context, mounts Mounts, path string) bool {
	if path == "" {
		return false
	}
	ok, err := mounts.IsMountPoint(path)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Mount not proven intact", "path", path, "err", err)
		return false
	}
	return ok
}
