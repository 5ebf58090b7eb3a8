package operations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/fsgroup"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// defaultProgressInterval is how often the progress of an ownership change
// is recorded when Config.ProgressInterval is 0.
const defaultProgressInterval = 5 * time.Second

// Results of an ownership change, as OwnershipObserver.OwnershipDone gets them.
const (
	OwnershipChanged     = "changed"
	OwnershipSkipped     = "skipped"
	OwnershipInterrupted = "interrupted"
	OwnershipFailed      = "failed"
)

// ownershipNeeded says whether the agent must give the published volume's
// files to the pod's fsGroup itself: the kubelet's csi_mounter.go SetUpAt
// and supportsFSGroup. Not when the driver applies the group
// (VOLUME_MOUNT_GROUP: volume_mount_group was sent), not for block volumes,
// not without fsGroup, not for read-only volumes, not with fsGroupPolicy
// None. With File, always; with ReadWriteOnceWithFSType (the default), only
// with an fsType and, for a PV, a ReadWriteOnce or ReadWriteOncePod access
// mode (inline volumes are ReadWriteOnce).
func ownershipNeeded(src volume.Source, pv volume.PodVolume, pol volume.Policy, caps csiclient.NodeCapabilities) bool {
	switch {
	case src.AccessType != volume.Filesystem, caps.VolumeMountGroup(),
		pv.FSGroup == nil, pv.ReadOnly, pol.FSGroupPolicy == storagev1.NoneFSGroupPolicy:
		return false
	case pol.FSGroupPolicy == storagev1.FileFSGroupPolicy:
		return true
	case src.FSType == "":
		return false
	case src.Inline:
		return true
	}
	return slices.ContainsFunc(src.AccessModes, func(m corev1.PersistentVolumeAccessMode) bool {
		return m == corev1.ReadWriteOnce || m == corev1.ReadWriteOncePod
	})
}

// owners tracks the ownership changes in flight, so that a pod that no
// longer wants its volume interrupts its change (Interrupt).
type owners struct {
	observer   OwnershipObserver
	onProgress func(volume.PodKey)
	interval   time.Duration

	mu   sync.Mutex
	runs map[volume.PodKey]context.CancelFunc
}

func newOwners(cfg Config) *owners {
	interval := cfg.ProgressInterval
	if interval <= 0 {
		interval = defaultProgressInterval
	}
	return &owners{observer: cfg.Ownership, onProgress: cfg.OnProgress, interval: interval,
		runs: map[volume.PodKey]context.CancelFunc{}}
}

// register returns the context an ownership change of key runs on, which
// Interrupt(key) cancels, and the function that releases it.
func (w *owners) register(ctx context.Context, key volume.PodKey) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.runs[key] = cancel
	w.mu.Unlock()
	return ctx, func() {
		w.mu.Lock()
		delete(w.runs, key)
		w.mu.Unlock()
		cancel()
	}
}

// Interrupt stops the fsGroup ownership change of a pod's volume, if one
// is in flight or about to start with the publish in flight: for a pod
// that no longer wants the volume (it was deleted), so that its unpublish
// need not wait for a walk of millions of files. The publish ends
// uncertain and is torn down. It does not block.
func (o *Operations) Interrupt(key volume.PodKey) {
	o.owners.mu.Lock()
	cancel, ok := o.owners.runs[key]
	o.owners.mu.Unlock()
	if ok {
		cancel()
	}
}

// changeOwnership gives the files of the volume published at target to
// pv's fsGroup (lifecycle/fsgroup), honouring fsGroupChangePolicy. While it
// runs its progress is recorded in the actual state every interval, and
// the observers are told. Its error (interrupted, or a directory that
// cannot be read) leaves the publish uncertain, as the kubelet's.
func (o *Operations) changeOwnership(ctx context.Context, key volume.PodKey, id volume.ID, target string, pv volume.PodVolume) (err error) {
	driver := id.Driver
	gid := *pv.FSGroup
	onRootMismatch := pv.FSGroupChangePolicy != nil && *pv.FSGroupChangePolicy == corev1.FSGroupChangeOnRootMismatch
	logger := klog.FromContext(ctx).WithValues("fsGroup", gid, "targetPath", target)
	start := time.Now()
	w := o.owners
	if w.observer != nil {
		w.observer.OwnershipRunning(driver, 1)
		defer w.observer.OwnershipRunning(driver, -1)
	}

	var files atomic.Int64
	var reported int64
	report := func(now time.Time) {
		n := files.Load()
		if w.observer != nil {
			w.observer.OwnershipFiles(driver, n-reported)
		}
		reported = n
		o.state.RecordProgress(key, id, &asw.Progress{Step: volume.StepApplyAccessControl, FSGroup: gid, Files: n, Started: start, Updated: now})
		if w.onProgress != nil {
			w.onProgress(key)
		}
	}
	done := make(chan struct{})
	var ticker sync.WaitGroup
	ticker.Go(func() {
		t := time.NewTicker(w.interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				report(now)
			}
		}
	})
	res, err := fsgroup.Change(ctx, target, gid, fsgroup.Options{OnRootMismatch: onRootMismatch, Progress: &files})
	close(done)
	ticker.Wait()
	if w.observer != nil {
		w.observer.OwnershipFiles(driver, files.Load()-reported)
	}
	o.state.RecordProgress(key, id, nil)

	result := OwnershipChanged
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		result = OwnershipInterrupted
	case err != nil:
		result = OwnershipFailed
	case res.Skipped:
		result = OwnershipSkipped
	}
	if w.observer != nil {
		w.observer.OwnershipDone(driver, result)
	}
	if res.Skipped {
		logger.V(3).Info("Volume root already has the fsGroup; ownership change skipped (OnRootMismatch)")
		return nil
	}
	// The kubelet records volume_apply_access_control with migrated
	// "false" whatever the volume (SetVolumeOwnership's CompleteFuncParam
	// carries no Migrated).
	o.observe(driver, volume.StepApplyAccessControl, volume.Filesystem, false, start, err)
	if err != nil {
		logger.V(2).Info("Changing the volume's group failed", "files", res.Files, "err", err)
		return fmt.Errorf("changing the group of the volume's files to fsGroup %d: %w", gid, err)
	}
	logger.V(2).Info("Gave the volume's files to the fsGroup", "files", res.Files, "changed", res.Changed,
		"failed", res.Failed, "duration", time.Since(start))
	return nil
}
